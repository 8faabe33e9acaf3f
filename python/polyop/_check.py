"""``python -m polyop check PATH``: what a built polyop library is and whether it works here.

Reports which framework the library targets, its namespace / prefix / domain, every op with
its schema, whether it loads in the installed framework, and a smoke call of each op on small
random inputs whose shapes pass the library's own shape inference (outputs must have the
inferred shapes and dtypes). Loading and calling happen in a subprocess, so a crash (a
library built for another framework version, a missing symbol, a segfault) is diagnosed, not
propagated. A file that is not a polyop library gets a diagnosis too.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from typing import Any

from ._library import FRAMEWORKS, op_notes, require_framework


# ------------------------------------------------------------------------------ ELF symbols


def _elf(path: str) -> tuple[bytes, list[tuple[int, int, int, int, int]]]:
    """The bytes and section headers ``(type, offset, size, link, entsize)`` of a 64-bit
    little-endian ELF shared object; ValueError for anything else."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    e_type, = struct.unpack_from("<H", data, 16)
    if e_type != 3:
        raise ValueError("an ELF file but not a shared library (ET_DYN)")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(shnum):
        off = shoff + i * shentsize
        _name, sh_type, _flags, _addr, sh_offset, sh_size, sh_link, _info, _align, sh_entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, off
        )
        sections.append((sh_type, sh_offset, sh_size, sh_link, sh_entsize))
    return data, sections


def _cstr(data: bytes, off: int) -> str:
    return data[off:data.index(b"\0", off)].decode(errors="replace")


def elf_symbols(path: str) -> tuple[set[str], set[str]]:
    """(defined, undefined) dynamic symbol names of an ELF shared object. Raises ValueError
    for a file that is not a 64-bit little-endian ELF shared object."""
    data, sections = _elf(path)
    defined, undefined = set(), set()
    for sh_type, off, size, link, entsize in sections:
        if sh_type != 11:  # SHT_DYNSYM
            continue
        str_off = sections[link][1]
        for k in range(size // (entsize or 24)):
            st_name, _st_info, _other, st_shndx = struct.unpack_from("<IBBH", data, off + k * 24)
            name = _cstr(data, str_off + st_name)
            if not name:
                continue
            (undefined if st_shndx == 0 else defined).add(name)
    return defined, undefined


def elf_dynamic(path: str) -> dict[str, list[str]]:
    """The dynamic section's ``needed`` libraries and ``runpath`` / ``rpath`` entries (each
    split at ``:``) of an ELF shared object."""
    data, sections = _elf(path)
    out: dict[str, list[str]] = {"needed": [], "runpath": [], "rpath": []}
    tags = {1: "needed", 15: "rpath", 29: "runpath"}  # DT_NEEDED, DT_RPATH, DT_RUNPATH
    for sh_type, off, size, link, entsize in sections:
        if sh_type != 6:  # SHT_DYNAMIC
            continue
        str_off = sections[link][1]
        for k in range(size // (entsize or 16)):
            tag, val = struct.unpack_from("<qQ", data, off + k * 16)
            if tag == 0:
                break
            if tag in tags:
                v = _cstr(data, str_off + val)
                out[tags[tag]].extend(v.split(":") if tags[tag] != "needed" else [v])
    return out


def guess_framework(defined: set[str], undefined: set[str]) -> str | None:
    if "RegisterCustomOps" in defined:
        return "onnxruntime"
    if any(s.startswith("aoti_torch_") or s.startswith("torch_library") for s in undefined):
        return "torch"
    if any(s.startswith("TF_") for s in undefined):
        return "tensorflow"
    if "polyop_library_info" in defined:
        return "xla"
    return None


# ------------------------------------------------------------------------------ the worker


def _attr_value(a: dict) -> Any:
    return {"int": 1, "float": 1.0, "bool": False, "str": "", "int[]": [1], "float[]": [1.0]}.get(a["type"], 1)


def smoke_inputs(info: dict, infer) -> tuple[list, dict, list] | None:
    """Input specs + attributes for a smoke call that pass shape inference, or None."""
    dtypes = info["dtypes"]
    dtype = "float32" if "float32" in dtypes else dtypes[0]
    attrs = {a["name"]: _attr_value(a) for a in info["attrs"] if a["required"]}
    for shape in [(2, 3), (3,), (2, 2, 2, 2), (2, 2), (3, 3), ()]:
        specs = []
        for inp in info["inputs"]:
            if inp["optional"]:
                specs.append(None)
            else:
                specs.append((shape, dtype if inp["dtype"] == "T" else inp["dtype"]))
        try:
            return specs, attrs, infer(info["name"], specs, **attrs)
        except Exception:  # noqa: BLE001 - try the next candidate
            continue
    return None


def _array(rng, shape, dtype):
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes

        return rng.uniform(-1, 1, size=shape).astype(ml_dtypes.bfloat16)
    if dtype.startswith("float"):
        return rng.uniform(-1, 1, size=shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(0, 4, size=shape).astype(dtype)


def _to_numpy(o):
    import numpy as np

    if hasattr(o, "detach"):  # torch
        import torch

        o = o.detach()
        if o.dtype == torch.bfloat16:
            import ml_dtypes

            return o.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return o.numpy()
    if hasattr(o, "numpy"):
        a = o.numpy()
        if str(getattr(o, "dtype", "")) == "<dtype: 'bfloat16'>":
            import ml_dtypes

            a = a.astype(ml_dtypes.bfloat16)
        return a
    return np.asarray(o)


def _caller(fw: str, path: str):
    """fn(name, arrays, attrs) -> outputs, through ``polyop.<framework>.load(path)`` (the
    framework's ordinary entry points plus the polyop glue)."""
    import importlib

    loaded = importlib.import_module(FRAMEWORKS[fw].glue).load(path)
    if fw == "torch":
        def call(name, arrays, attrs):
            return loaded.call(name, *[None if a is None else _torch_tensor(a) for a in arrays], **attrs)

        return call
    return lambda name, arrays, attrs: loaded.call(name, *arrays, **attrs)


def _torch_tensor(a):
    import numpy as np
    import torch

    if a.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def _load(fw: str, path: str) -> str:
    """Load with the framework's ordinary call; returns the framework version."""
    if fw == "torch":
        import torch

        torch.ops.load_library(path)
        return f"torch {torch.__version__}"
    if fw == "tensorflow":
        import tensorflow as tf

        tf.load_op_library(path)
        return f"tensorflow {tf.__version__}"
    if fw == "onnxruntime":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.register_custom_ops_library(path)
        return f"onnxruntime {ort.__version__}"
    import ctypes

    import jax

    jax.config.update("jax_enable_x64", True)  # int64 / float64 stay what they are
    ctypes.cdll.LoadLibrary(path)
    return f"jax {jax.__version__} (jaxlib {jax.lib.__version__ if hasattr(jax.lib, '__version__') else '?'})"


def worker(fw: str, path: str) -> int:
    """Runs in the subprocess; prints one JSON report on stdout's last line."""
    import numpy as np

    report: dict[str, Any] = {"framework": fw, "stage": "import"}

    def emit(code: int) -> int:
        print("\n" + json.dumps(report), flush=True)
        return code

    try:
        require_framework(fw)
    except Exception as e:  # noqa: BLE001
        report["error"] = f"{type(e).__name__}: {e}"
        return emit(1)
    report["stage"] = "load"
    try:
        report["framework_version"] = _load(fw, path)
    except Exception as e:  # noqa: BLE001
        report["error"] = f"{type(e).__name__}: {e}"
        # Frameworks often wrap the dynamic loader's message ("Could not load this library");
        # ask the loader directly for the reason (undefined symbol, wrong ELF class, ...).
        import ctypes

        try:
            ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as le:
            if str(le) not in report["error"]:
                report["error"] += f" (dynamic loader: {le})"
        return emit(1)
    report["stage"] = "metadata"
    from polyop._library import open_library

    try:
        lib = open_library(path)
    except Exception as e:  # noqa: BLE001
        report["error"] = f"{type(e).__name__}: {e}"
        return emit(1)
    report["library"] = {"framework": lib.framework, "name_key": lib.name_key, "name": lib.name,
                         "exported": lib.exported}
    report["ops"] = [{"name": o["name"], "schema": o["schema"], "dtypes": o["dtypes"],
                      "flags": o["flags"], "backward": (o["backward"] or {}).get("op")} for o in lib.ops()]
    if fw == "xla":
        import ctypes

        dll = ctypes.CDLL(path)
        lookup = getattr(dll, f"{lib.name}xla_handler", None)
        if lookup is None:
            report["missing_symbols"] = [f"{lib.name}xla_handler"]
        else:
            lookup.restype, lookup.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
            report["missing_symbols"] = [f"{lib.name}xla_handler({n!r})" for n in lib.exported
                                         if not lookup(n.encode())]
        report["unexported_ops"] = [o["name"] for o in lib.ops()
                                    if not o["flags"]["inplace"] and o["name"] not in lib.exported]
    report["stage"] = "smoke"
    rng = np.random.default_rng(0)
    try:
        call = _caller(fw, path)
    except Exception as e:  # noqa: BLE001
        report["error"] = f"setting up calls: {type(e).__name__}: {e}"
        return emit(1)
    smoke = []
    forward_of = {o["backward"]["op"]: o for o in lib.ops() if o["backward"]}
    ran: dict[str, tuple[list, dict, list]] = {}  # forward op -> (arrays, attrs, numpy outputs)
    # Forward ops first, so a backward op can be fed its forward op's real inputs and outputs.
    ordered = sorted(lib.ops(), key=lambda o: o["flags"]["backward_only"])
    for info in ordered:
        name = info["name"]
        entry: dict[str, Any] = {"op": name}
        smoke.append(entry)
        if name not in lib.exported:
            entry["status"] = "skipped"
            entry["detail"] = ("not exposed on this framework (in-place op)" if info["flags"]["inplace"]
                               else "not exported by this library")
            continue
        fwd = forward_of.get(name)
        if fwd is not None and fwd["name"] in ran:
            # A backward op: its inputs are the forward call's grads / inputs / outputs.
            f_arrays, f_attrs, f_outs = ran[fwd["name"]]
            arrays = []
            for kind, i in fwd["backward"]["inputs"]:
                if kind == "grad":
                    o = f_outs[i]
                    arrays.append(_array(rng, o.shape, o.dtype.name))
                elif kind == "input":
                    arrays.append(f_arrays[i])
                else:
                    arrays.append(f_outs[i])
            battrs = {a["name"] for a in info["attrs"]}
            attrs = {k: v for k, v in f_attrs.items() if k in battrs}
            specs = [None if a is None else (tuple(a.shape), a.dtype.name) for a in arrays]
            try:
                out_specs = lib.infer(name, specs, **attrs)
            except Exception as e:  # noqa: BLE001
                entry["status"] = "fail"
                entry["detail"] = f"shape inference refused the forward op's grads/inputs/outputs: {e}"
                continue
        else:
            picked = smoke_inputs(info, lib.infer)
            if picked is None:
                entry["status"] = "skipped"
                entry["detail"] = "no small input shape passed shape inference"
                continue
            specs, attrs, out_specs = picked
            arrays = [None if s is None else _array(rng, s[0], s[1]) for s in specs]
        entry["inputs"] = [None if s is None else [list(s[0]), s[1]] for s in specs]
        entry["attrs"] = attrs
        if fw == "xla" and info["flags"]["data_dependent_shape"]:
            try:
                call(name, arrays, attrs)
                entry["status"] = "fail"
                entry["detail"] = "a data-dependent op ran under XLA instead of refusing"
            except Exception as e:  # noqa: BLE001
                entry["status"] = "ok"
                entry["detail"] = f"refused as expected (static shapes only): {str(e)[:120]}"
            continue
        try:
            out = call(name, arrays, attrs)
            outs = [_to_numpy(o) for o in (out if isinstance(out, (tuple, list)) else [out])]
            ran[name] = (arrays, attrs, outs)
            got = [(list(o.shape), o.dtype.name) for o in outs]
            entry["outputs"] = got
            bad = []
            for (shape, dt), (gs, gd) in zip(out_specs, got):
                if gd != dt or (shape is not None and (len(shape) != len(gs) or any(
                        d is not None and d != g for d, g in zip(shape, gs)))):
                    bad.append(f"got {gd}{gs}, inferred {dt}{list(shape) if shape else shape}")
            if len(got) != len(out_specs):
                bad.append(f"{len(got)} outputs, schema has {len(out_specs)}")
            entry["status"] = "fail" if bad else "ok"
            if bad:
                entry["detail"] = "; ".join(bad)
        except Exception as e:  # noqa: BLE001
            entry["status"] = "fail"
            entry["detail"] = f"{type(e).__name__}: {str(e)[:300]}"
    order = {o["name"]: k for k, o in enumerate(lib.ops())}
    smoke.sort(key=lambda e: order[e["op"]])
    report["smoke"] = smoke
    report["stage"] = "done"
    return emit(0)


# ------------------------------------------------------------------------------ the parent


def _diagnose_load(fw: str, err: str) -> str:
    if "undefined symbol" in err:
        sym = err.split("undefined symbol:")[-1].strip().split()[0].rstrip(")") if "undefined symbol:" in err else "?"
        return (f"the library needs symbol `{sym}`, which the installed {fw} does not provide: it was "
                f"probably built against a different {fw} version; rebuild it against the installed one")
    if "GLIBC" in err or "GLIBCXX" in err:
        return "the library needs a newer C/C++ runtime than this system has; rebuild it here"
    if "API version" in err or "api_version" in err:
        return f"the library was built for another {fw} API version; rebuild it against the installed one"
    if "wrong ELF class" in err or "invalid ELF header" in err:
        return "not a loadable shared library for this platform"
    return "the framework refused to load the library"


def check(path: str, timeout: float = 600.0, python: str = sys.executable) -> tuple[int, str]:
    """Check one library; returns (exit code, report text)."""
    lines: list[str] = [f"library:   {path}"]
    if not os.path.isfile(path):
        return 2, "\n".join(lines + ["result:    FAIL - no such file"])
    try:
        defined, undefined = elf_symbols(path)
    except (ValueError, struct.error, IndexError) as e:
        return 1, "\n".join(lines + [f"result:    FAIL - not a polyop library: {e}"])
    if "polyop_library_info" not in defined:
        hint = guess_framework(defined, undefined)
        extra = f" (it looks like a {hint} extension)" if hint else ""
        return 1, "\n".join(lines + [
            f"result:    FAIL - not a polyop library: no `polyop_library_info` export{extra}; build "
            "it with an adapter's export! macro (docs/authoring.md)"])
    fw = guess_framework(defined, undefined) or "xla"
    lines.append(f"framework: {fw} (from the library's symbols)")
    env = dict(os.environ)
    try:
        p = subprocess.run([python, "-m", "polyop._check", fw, os.path.abspath(path)], capture_output=True,
                           text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return 1, "\n".join(lines + [f"result:    FAIL - loading/smoke-testing hung for {timeout:.0f}s"])
    report = None
    for line in reversed(p.stdout.strip().splitlines()):
        try:
            report = json.loads(line)
            break
        except ValueError:
            continue
    if report is None:
        how = (f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exit status {p.returncode}")
        tail = (p.stderr or "").strip().splitlines()[-6:]
        return 1, "\n".join(lines + [
            f"result:    FAIL - the process loading the library crashed ({how}) before reporting; "
            f"the library is probably built for another {fw} version or is broken",
            *("  | " + t for t in tail)])
    if report.get("framework_version"):
        lines.append(f"installed: {report['framework_version']}")
    if report.get("error"):
        stage = report["stage"]
        err = report["error"]
        diag = _diagnose_load(fw, err) if stage == "load" else {
            "import": f"{FRAMEWORKS[fw].display} is not installed in this Python "
                      f"(pip install {FRAMEWORKS[fw].pip})",
            "metadata": "the library loaded but its polyop metadata is unusable",
        }.get(stage, "")
        return 1, "\n".join(lines + [f"loads:     no ({stage}): {' '.join(err.split())[:500]}",
                                     f"result:    FAIL - {diag}"])
    lines.append("loads:     yes")
    lib = report["library"]
    lines.append(f"{lib['name_key']:<10} {lib['name']}")
    lines.append(f"ops ({len(report['ops'])}):")
    for o in report["ops"]:
        notes = op_notes(o["flags"], o["backward"])
        lines.append(f"  {o['schema']}  [{','.join(o['dtypes'])}]" + (f"  ({'; '.join(notes)})" if notes else ""))
    failed = 0
    for key, what in (("missing_symbols", "missing handler symbols"), ("unexported_ops", "ops without an XLA handler")):
        if report.get(key):
            failed += 1
            lines.append(f"FAIL {what}: {', '.join(report[key])}")
    lines.append("smoke calls:")
    for s in report["smoke"]:
        st = s["status"]
        failed += st == "fail"
        shapes = ""
        if "inputs" in s:
            shapes = " " + ", ".join("None" if i is None else f"{i[1]}{i[0]}" for i in s["inputs"])
            if s.get("outputs"):
                shapes += " -> " + ", ".join(f"{d}{sh}" for sh, d in s["outputs"])
        lines.append(f"  {st:<7} {s['op']}{shapes}" + (f"  {s['detail']}" if s.get("detail") else ""))
    lines.append("result:    " + ("OK" if not failed else f"FAIL - {failed} problem(s)"))
    return (1 if failed else 0), "\n".join(lines)


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1], sys.argv[2]))
