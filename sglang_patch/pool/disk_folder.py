"""Who may write the disk tier's folder (``sglang_patch/pool/disk_tier.py``, issue 35).

A page's checksums guard against damage, not against a forger, who can recompute them: whoever
can write the folder decides what the engine serves. So the folder and its subfolders must
belong to the engine's user (or root) and be writable by no one else, and the tier creates what
it writes as its user's alone (folders 0700, files 0600). ``docs/deploy.md``, "Surviving a
reboot", says how to set a folder up.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

FOLDER_MODE = 0o700  # what the tier creates: its user's alone
FILE_MODE = 0o600


class UnsafeDiskFolder(Exception):
    """The disk tier's folder can be written by someone other than the engine's user (and
    root): they could plant forged pages. The message names the folder, its mode and the fix."""


def _unsafe(st: os.stat_result, euid: int) -> str | None:
    """Why a folder with this ``stat`` must not hold pages, or None. Root may own it (root can
    write anything anyway); any other owner can chmod it at will; a group or world write bit
    lets every member plant pages (a sticky bit does not help: planting needs no renaming)."""
    if st.st_uid not in (euid, 0):
        return f"owned by uid {st.st_uid}, not by this engine's user (uid {euid}) or root"
    if st.st_mode & stat.S_IWOTH:
        return "writable by every user"
    if st.st_mode & stat.S_IWGRP:
        return f"writable by its group (gid {st.st_gid})"
    return None


def _refuse(path: Path, st: os.stat_result, why: str, root: Path) -> UnsafeDiskFolder:
    fix = (f"chown -R {os.geteuid()} {root}" if why.startswith("owned")
           else f"chmod -R go-w {root}" if path != root else f"chmod go-w {root}")
    return UnsafeDiskFolder(
        f"disk tier folder {path} is {why} (mode {stat.S_IMODE(st.st_mode):04o}): whoever can "
        f"write it can plant pages that this engine serves; fix: {fix} (docs/deploy.md, "
        "'Surviving a reboot')")


def check_folder(root: str | os.PathLike[str]) -> Path:
    """Create ``root`` (0700) if missing, and check that only the engine's user can write it
    and the subfolders it holds; :class:`UnsafeDiskFolder` if not, OSError if it cannot be
    made or read. Also refused: a parent that every user may write without the sticky bit
    (anyone could swap the folder for their own). Not checked: a parent that a group or
    another user may write (they too could swap it): keep the folder under the engine
    user's own home or a root-owned path (``docs/deploy.md``)."""
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True, mode=FOLDER_MODE)
    path = path.resolve()
    euid = os.geteuid()
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDiskFolder(f"disk tier folder {path} is not a folder")
    why = _unsafe(st, euid)
    if why is not None:
        raise _refuse(path, st, why, path)
    for parent in path.parents:
        pst = parent.stat()
        if pst.st_mode & stat.S_IWOTH and not pst.st_mode & stat.S_ISVTX:
            raise UnsafeDiskFolder(
                f"disk tier folder {path}: its parent {parent} is writable by every user "
                f"without the sticky bit (mode {stat.S_IMODE(pst.st_mode):04o}): anyone can "
                f"replace the folder; fix: chmod o-w {parent}, or choose another place")
    for sub in path.iterdir():
        with contextlib.suppress(FileNotFoundError):
            sst = sub.lstat()
            if stat.S_ISDIR(sst.st_mode):
                why = _unsafe(sst, euid)
                if why is not None:
                    raise _refuse(sub, sst, why, path)
    return path
