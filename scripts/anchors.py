#!/usr/bin/env python3
"""Where an anchor tool (erofsfuse, mksquashfs, ...) lives: under ANCHORS
[/work/anchors] as TOOL/bin/NAME (one prefix per project) or bin/NAME (one shared
prefix), else NAME on the PATH, else NAME itself.

usage: scripts/anchors.py NAME      prints the path (for shell scripts)
       from anchors import find     (Python scripts in this folder)
"""
import glob
import os
import shutil
import sys


def find(name):
    root = os.environ.get("ANCHORS", "/work/anchors")
    for c in sorted(glob.glob(os.path.join(root, "*", "bin", name))) + [
        os.path.join(root, "bin", name)
    ]:
        if os.access(c, os.X_OK):
            return c
    return shutil.which(name) or name


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip())
    print(find(sys.argv[1]))
