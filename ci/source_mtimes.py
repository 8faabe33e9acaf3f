"""Give a fresh checkout's files modification times by content, so that cargo (which decides
what to rebuild by comparing a source's mtime with its last build's) rebuilds from CI's cached
target directories only what changed since the last run, not every workspace crate.

    python3 ci/source_mtimes.py RECORD

RECORD (a file in CI's build cache) lists, per file, the content's sha256 and the mtime the
last run gave it. A file whose content is what the last run had gets that mtime back; any other
file (changed, new, or no record yet) gets the time of this run's start, and the record is
rewritten. So a file keeps its mtime for as long as its content stays the same from one run to
the next, and the first run with new content stamps it later than any build before that run.

Sound as long as the cache is written by CI runs only, one run after another. Take a file whose
content now differs from the content some cached output was built from, in an earlier run R.
Its mtime is the start of the first of the consecutive runs (ending with this one) that had
its current content; R had other content, so R came before that run, and ended before it
started: the mtime is later than the build, and cargo rebuilds.
(A plain "mtime = last commit's time" is not: a commit made while a run was building carries
a time older than that run's outputs.) Files are hashed as they are in the working tree, so
uncommitted edits count as changes too.
"""

import hashlib
import os
import subprocess
import sys
import time


def checkout_files(root: str) -> list[str]:
    """The working tree's files git knows or would add: tracked and untracked, not ignored."""
    out = subprocess.run(
        ["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True, capture_output=True).stdout
    return sorted({p for p in out.decode().split("\0") if p})


def read_record(path: str) -> dict[str, tuple[str, int]]:
    record = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 3:
                    record[parts[2]] = (parts[0], int(parts[1]))
    except (FileNotFoundError, ValueError):
        return {}
    return record


def main(root: str, record_path: str) -> None:
    now = int(time.time())
    old = read_record(record_path)
    new, kept = [], 0
    for rel in checkout_files(root):
        full = os.path.join(root, rel)
        if os.path.islink(full) or not os.path.isfile(full):
            continue
        with open(full, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        digest_then, mtime = old.get(rel, ("", now))
        if digest_then != digest:
            mtime = now
        else:
            kept += 1
        os.utime(full, (mtime, mtime))
        new.append(f"{digest}\t{mtime}\t{rel}\n")
    tmp = record_path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(new)
    os.replace(tmp, record_path)
    print(f"source mtimes: {kept} of {len(new)} files unchanged since the last run keep theirs")


if __name__ == "__main__":
    main(os.getcwd(), sys.argv[1])
