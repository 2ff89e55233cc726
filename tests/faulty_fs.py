"""A FUSE passthrough filesystem whose writes fail on demand with a real errno, as an NFS
server's fail-over (EIO, ESTALE) or a lost Lustre client (ENOTCONN) makes them fail: the
kernel returns the error to the process, so ddrl meets it exactly as it would there.

Run as `python faulty_fs.py BACKING MOUNTPOINT CONTROL` (foreground). CONTROL is a file
outside the mount holding `ERRNO COUNT SUBSTRING [OPS]`: the next COUNT of the operations OPS
(comma-separated, of write, fsync, rename, getattr; by default the first three) on paths
containing SUBSTRING fail with ERRNO (COUNT -1: all of them, until CONTROL changes); CONTROL
empty or absent: nothing fails. Each failure is appended to CONTROL.log."""
from __future__ import annotations

import errno
import os
import sys
import threading

from fuse import FUSE, FuseOSError, Operations


class Faulty(Operations):
    def __init__(self, root: str, control: str):
        self.root, self.control = root, control
        self._lock = threading.Lock()
        self._fds: dict[int, str] = {}

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _maybe_fail(self, op: str, path: str) -> None:
        with self._lock:
            try:
                with open(self.control) as fh:
                    words = fh.read().split()
            except FileNotFoundError:
                return
            if len(words) not in (3, 4) or words[2] not in path:
                return
            ops = words[3].split(",") if len(words) == 4 else ["write", "fsync", "rename"]
            code, count = int(words[0]), int(words[1])
            if count == 0 or op not in ops:
                return
            if count > 0:
                with open(self.control, "w") as fh:
                    fh.write(" ".join([words[0], str(count - 1), *words[2:]]))
            with open(self.control + ".log", "a") as fh:
                fh.write(f"{op} {path} {errno.errorcode[code]}\n")
        raise FuseOSError(code)

    # Reads and metadata pass through; a stat may fail on request (an NFS client whose file
    # handle went stale: ESTALE).
    def getattr(self, path, fh=None):
        self._maybe_fail("getattr", path)
        st = os.lstat(self._full(path))
        return {key: getattr(st, key) for key in (
            "st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size",
            "st_uid")}

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(self._full(path))]

    def access(self, path, amode):
        if not os.access(self._full(path), amode):
            raise FuseOSError(errno.EACCES)

    def statfs(self, path):
        st = os.statvfs(self._full(path))
        return {key: getattr(st, key) for key in (
            "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
            "f_flag", "f_frsize", "f_namemax")}

    def mkdir(self, path, mode):
        os.mkdir(self._full(path), mode)

    def rmdir(self, path):
        os.rmdir(self._full(path))

    def unlink(self, path):
        os.unlink(self._full(path))

    def chmod(self, path, mode):
        os.chmod(self._full(path), mode)

    def chown(self, path, uid, gid):
        os.chown(self._full(path), uid, gid)

    def utimens(self, path, times=None):
        os.utime(self._full(path), times)

    def symlink(self, target, source):
        os.symlink(source, self._full(target))

    def readlink(self, path):
        return os.readlink(self._full(path))

    def rename(self, old, new):
        self._maybe_fail("rename", new)
        os.rename(self._full(old), self._full(new))

    def open(self, path, flags):
        fd = os.open(self._full(path), flags)
        self._fds[fd] = path
        return fd

    def create(self, path, mode, fi=None):
        fd = os.open(self._full(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
        self._fds[fd] = path
        return fd

    def read(self, path, length, offset, fh):
        return os.pread(fh, length, offset)

    def write(self, path, data, offset, fh):
        self._maybe_fail("write", self._fds.get(fh, path))
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        with open(self._full(path), "r+") as f:
            f.truncate(length)

    def flush(self, path, fh):
        return None

    def fsync(self, path, datasync, fh):
        self._maybe_fail("fsync", self._fds.get(fh, path))
        os.fsync(fh)

    def release(self, path, fh):
        self._fds.pop(fh, None)
        os.close(fh)


if __name__ == "__main__":
    backing, mountpoint, control = sys.argv[1:4]
    # direct_io: every write reaches this process (no page cache in between), so a failure
    # is the writer's own write() or fsync() failing.
    FUSE(Faulty(backing, control), mountpoint, foreground=True, nothreads=False,
         direct_io=True, allow_other=False)
