"""Files written as a user expects them: whole or not at all (`atomic_write_text`), and with the
modes the user's umask gives (`umask_mode`, `follow_umask`), whatever mode a library or tempfile
chose."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def process_umask() -> int:
    """The process's umask, read without changing it (os.umask can only be read by setting it,
    which would race with other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_mode(directory: bool = False) -> int:
    """The mode `open()` or `mkdir()` would give a new file or directory under the process umask.
    tempfile's mkstemp/mkdtemp create 0600/0700 whatever the umask; what they stage is published
    with this mode, so results on a shared folder are as readable as any file the user creates."""
    return (0o777 if directory else 0o666) & ~process_umask()


def follow_umask(root: Path) -> None:
    """Libraries that write into a cache build choose their own modes (safetensors writes 0600);
    everything published in the cache gets the umask's modes like any file the user creates."""
    files, dirs = umask_mode(), umask_mode(directory=True)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), dirs)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, files)


def atomic_write_text(path: Path, text: str) -> None:
    """Write a result file so that a reader sees either the old file or the complete new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        os.fchmod(fd, umask_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:  # a failed write() names no file: name it
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise


def replace_block(path: Path | str, begin: str, end: str, body: str) -> bool:
    """Replaces what stands between the marker lines `begin` and `end` of a text file (a page's
    generated block) with `body`, written whole; True when the file changed."""
    from rag.types import RagError

    p = Path(path)
    text = p.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        raise RagError(f"{p}: no generated block to replace (the lines {begin!r} and {end!r})")
    head, rest = text.split(begin, 1)
    new = f"{head}{begin}\n{body}{end}{rest.split(end, 1)[1]}"
    if new == text:
        return False
    atomic_write_text(p, new)
    return True


def block_between(text: str, begin: str, end: str) -> str:
    """The generated block of a page's text, as `replace_block` wrote it."""
    return text.split(begin, 1)[1].split(end, 1)[0].removeprefix("\n")
