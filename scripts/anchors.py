#!/usr/bin/env python3
"""Where an anchor tool (erofsfuse, mksquashfs, ...) lives: under ANCHORS
[/work/anchors] as TOOL/bin/NAME or TOOL/sbin/NAME (one prefix per project), or
bin/NAME, sbin/NAME or NAME (one shared prefix), else NAME on the PATH, else NAME
itself.

usage: scripts/anchors.py NAME      prints the path (for shell scripts; exit 2 with a
                                    message when there is none)
       from anchors import find     (Python scripts in this folder)
"""
import glob
import os
import shutil
import sys


def find(name):
    root = os.environ.get("ANCHORS", "/work/anchors")
    for c in sorted(glob.glob(os.path.join(root, "*", "bin", name))) + sorted(
        glob.glob(os.path.join(root, "*", "sbin", name))
    ) + [os.path.join(root, d, name) for d in ("bin", "sbin", "")]:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return shutil.which(name) or name


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip())
    found = find(sys.argv[1])
    if not (os.path.isfile(found) and os.access(found, os.X_OK)):
        print(f"anchors.py: {sys.argv[1]} not found (under $ANCHORS or on the PATH)", file=sys.stderr)
        sys.exit(2)
    print(found)
