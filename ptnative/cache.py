"""The kernel cache: a private directory whose libraries are loaded only if
this user's ptnative wrote them there.

Rules (docs/writing-ops.md, "The kernel cache"):

* The cache directory must be a real directory (not a symbolic link), owned
  by the current user and not writable by group or others; otherwise
  :class:`CacheError` names it and the fix.  In the default layout its
  parent ``.../ptnative`` must be owned by the user and not writable by group
  or others too.
* A library is trusted only if it is a regular file (opened with
  ``O_NOFOLLOW``, so a symbolic link is never followed), owned by the user,
  not writable by group or others, a complete ELF shared object, and matches
  its integrity record (size and SHA-256, written after a successful build;
  the record is checked the same way).
* The bytes hashed are the bytes loaded: the library is opened once, checked
  through that descriptor (``fstat``, then read for the hash), and
  ``dlopen``-ed as ``/proc/self/fd/N``, so a file swapped after the check is
  never the one loaded.  The descriptor stays open while the process lives
  (libraries are never unloaded), which keeps the name unique.
* Without ``/proc/self/fd`` (macOS) the library is loaded by its path, under
  the cache's file lock, after it was checked again; the path must name the
  checked file (same device, inode, size and times) just before and just
  after ``dlopen``, or :class:`CacheError`.  That is weaker: a process of the
  same user that ignores the lock and swaps the file and back within the
  ``dlopen`` call is not seen (docs/writing-ops.md, "The kernel cache").
* A complete shared library is an ELF shared object on Linux and a Mach-O
  dynamic library (or bundle) of this machine's CPU on macOS
  (:func:`library_problem`).
* Every file operation after the directory check is relative to a descriptor
  of the checked directory (the compiler gets paths through
  ``/proc/<pid>/fd/<fd>``), so a parent renamed meanwhile cannot redirect it.

A library is hashed once per process per (inode, size, mtime, ctime, record).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import platform
import pwd
import shlex
import shutil
import stat
import struct
import sys
import threading
from pathlib import Path

RECORD_SUFFIX = ".integrity"
RECORD_FORMAT = 1
_RECORD_MAX_BYTES = 4096
_PROC_FD = "/proc/self/fd"
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class CacheError(RuntimeError):
    """The kernel cache directory, or a library in it, cannot be trusted and ptnative cannot repair it."""


class UntrustedLibraryWarning(UserWarning):
    """A cached library failed its checks and is being rebuilt (it was not loaded)."""


class Untrusted(Exception):
    """A cached file failed a check; ``str()`` says which, in words that follow "the library ..."."""


class Missing(Untrusted):
    """The library is not in the cache."""


class Unrecorded(Untrusted):
    """The library has no integrity record: built by an older ptnative, or its build was interrupted.  Not a sign
    of tampering, so it is rebuilt without a warning (never loaded)."""


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def default_dir() -> tuple[Path, Path]:
    """The default cache directory ``$XDG_CACHE_HOME/ptnative/<system>-<machine>-py<XY>`` (``XDG_CACHE_HOME``
    defaults to ``~/.cache``) and its ``ptnative`` parent."""
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tag = f"{platform.system().lower()}-{platform.machine()}-py{sys.version_info[0]}{sys.version_info[1]}"
    parent = Path(xdg) / "ptnative"
    return parent / tag, parent


def configured_dir() -> tuple[Path, Path | None]:
    """``$PTNATIVE_CACHE_DIR`` (no parent checked) or the default directory and its ``ptnative`` parent."""
    base = os.environ.get("PTNATIVE_CACHE_DIR")
    if base:
        return Path(base).expanduser(), None
    return default_dir()


def dir_problem(path: Path, st: os.stat_result, *, final: bool) -> str | None:
    """Why ``path`` (with ``st``, from ``lstat`` or ``fstat``) may not hold the cache, with the fix; None if fine."""
    uid = os.geteuid()
    fix = "or set PTNATIVE_CACHE_DIR to a private directory of yours (mode 0700)"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = f" (to {os.readlink(path)!r})"
        except OSError:
            target = ""
        return (f"ptnative's kernel cache {path} is a symbolic link{target}; a symbolic link can be redirected to "
                f"a directory someone else controls. Replace it with a real directory (rm {shlex.quote(str(path))} "
                f"&& mkdir -m 700 {shlex.quote(str(path))}) {fix}")
    if not stat.S_ISDIR(st.st_mode):
        return f"ptnative's kernel cache {path} is not a directory. Remove it {fix}"
    what = "kernel cache" if final else "kernel cache's parent directory"
    if st.st_uid != uid:
        return (f"ptnative's {what} {path} is owned by {_user(st.st_uid)}, not by you ({_user(uid)}); libraries "
                f"there could run another user's code in your process. Remove it (ptnative recreates it) {fix}")
    if st.st_mode & 0o022:
        return (f"ptnative's {what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"anyone who can write there could make your process run their code. Fix: chmod go-w "
                f"{shlex.quote(str(path))} (ptnative creates it with mode 0700) {fix}")
    return None


def _make_dirs(path: Path, parent: Path | None) -> None:
    try:
        if parent is not None:
            parent.parent.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(parent):
                os.mkdir(parent, 0o700)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(path):
            os.mkdir(path, 0o700)
    except FileExistsError:
        pass  # another process made it meanwhile; the checks below judge it
    except OSError as e:
        raise CacheError(f"ptnative cannot create its kernel cache {path}: {e}. Set PTNATIVE_CACHE_DIR to a "
                         "private directory of yours") from None


def directory_problem(path: Path | None = None, parent: Path | None = None) -> str | None:
    """Why the cache directory (by default the configured one, created if missing) fails the rules; None if not."""
    if path is None:
        path, parent = configured_dir()
        _make_dirs(path, parent)
    try:
        if parent is not None:
            problem = dir_problem(parent, os.stat(parent), final=False)  # a symlinked parent is judged by its target
            if problem:
                return problem
        return dir_problem(path, os.lstat(path), final=True)
    except OSError as e:
        return f"ptnative cannot examine its kernel cache {path}: {e}"


def checked_dir() -> Path:
    """The configured cache directory, created (mode 0700) if missing; :class:`CacheError` if it fails the rules."""
    path, parent = configured_dir()
    _make_dirs(path, parent)
    problem = directory_problem(path, parent)
    if problem:
        raise CacheError(problem)
    return path


class Directory:
    """An open descriptor of the checked cache directory (re-checked through the descriptor itself)."""

    def __init__(self, path: Path):
        self.path = path
        self.owners = frozenset({os.geteuid()})  # whose files it may hold
        try:
            self.fd = os.open(path, _DIR_FLAGS)
        except OSError as e:
            problem = directory_problem(path) if e.errno in (errno.ELOOP, errno.ENOTDIR) else None
            raise CacheError(problem or f"ptnative cannot open its kernel cache {path}: {e}") from None
        problem = dir_problem(path, os.fstat(self.fd), final=True)
        if problem:
            os.close(self.fd)
            raise CacheError(problem)

    def __enter__(self) -> Directory:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def child_path(self) -> str:
        """A path that names this very directory in a child process (the compiler): ``/proc/<pid>/fd/<fd>``
        resolves through the checked descriptor, so renaming a parent directory meanwhile cannot make the
        compiler read or write elsewhere.  The plain path where ``/proc`` does not offer that."""
        via = f"/proc/{os.getpid()}/fd/{self.fd}"
        if not proc_fd_usable():
            return str(self.path)
        try:
            st, mine = os.stat(via), os.fstat(self.fd)
            if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                return via
        except OSError:
            pass
        return str(self.path)

    def make_build_dir(self, stem: str) -> str:
        """A new private (0700) directory in the cache for one build; return its name."""
        for k in range(100):
            name = f".{stem}.{os.getpid()}.{threading.get_ident()}.{k}.build"
            try:
                os.mkdir(name, 0o700, dir_fd=self.fd)
                return name
            except FileExistsError:
                continue
        raise CacheError(f"ptnative cannot create a build directory in its kernel cache {self.path}")

    def remove_tree(self, name: str) -> None:
        shutil.rmtree(name, dir_fd=self.fd, ignore_errors=True)

    def open_checked(self, name: str) -> tuple[int, os.stat_result]:
        """Open ``name`` without following a symbolic link; :class:`Untrusted` unless it is a regular file owned
        by the user (one of :attr:`owners`) and not writable by group or others.  The caller closes the
        descriptor."""
        try:
            fd = os.open(name, _OPEN_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            raise Missing("is not in the cache") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Untrusted("is a symbolic link") from None
            raise Untrusted(f"cannot be opened ({e.strerror})") from None
        st = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(st.st_mode):
            problem = "is not a regular file"
        elif st.st_uid not in self.owners:
            problem = f"is owned by {_user(st.st_uid)}, not by you"
        elif st.st_mode & 0o022:
            problem = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        if problem:
            os.close(fd)
            raise Untrusted(problem)
        return fd, st

    def read_record(self, name: str) -> dict:
        """The integrity record of library ``name``, checked like a library; :class:`Untrusted` if unusable."""
        try:
            fd, st = self.open_checked(name + RECORD_SUFFIX)
        except Missing:
            raise Unrecorded("has no integrity record (it was not written by this version of ptnative, or its "
                             "build did not finish)") from None
        except Untrusted as e:
            raise Untrusted(f"has an integrity record that {e}") from None
        try:
            data = os.pread(fd, _RECORD_MAX_BYTES + 1, 0)
        finally:
            os.close(fd)
        try:
            record = json.loads(data.decode()) if len(data) <= _RECORD_MAX_BYTES else None
            valid = (isinstance(record, dict) and record.get("format") == RECORD_FORMAT
                     and record.get("library") == name and type(record.get("size")) is int
                     and isinstance(record.get("sha256"), str) and len(record["sha256"]) == 64)
        except (UnicodeDecodeError, ValueError):
            valid = False
        if not valid:
            raise Untrusted("has a malformed integrity record")
        return record

    def write_new(self, stem: str, data: bytes, mode: int = 0o600) -> str:
        """Write ``data`` to a new file named after ``stem`` (never an existing one); return its name."""
        for k in range(100):
            name = f".{stem}.{os.getpid()}.{threading.get_ident()}.{k}.tmp"
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                             dir_fd=self.fd)
            except FileExistsError:
                continue
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except BaseException:
                os.close(fd)
                os.unlink(name, dir_fd=self.fd)
                raise
            os.close(fd)
            return name
        raise CacheError(f"ptnative cannot create a temporary file in its kernel cache {self.path}")

    def replace(self, tmp: str, name: str) -> None:
        try:
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as e:
            os.unlink(tmp, dir_fd=self.fd)
            raise CacheError(f"ptnative cannot install {self.path / name}: {e}. Remove it by hand") from None

    def discard(self, name: str) -> None:
        """Remove ``name`` and its record if present (not following links: the entries themselves go)."""
        for entry in (name + RECORD_SUFFIX, name):
            try:
                try:
                    os.unlink(entry, dir_fd=self.fd)
                except IsADirectoryError:
                    os.rmdir(entry, dir_fd=self.fd)  # only an empty one: never delete a tree
            except FileNotFoundError:
                pass
            except OSError as e:
                raise CacheError(f"ptnative cannot remove the untrusted {self.path / entry}: {e}. Remove it by "
                                 "hand") from None

    def install(self, name: str, data: bytes) -> None:
        """Install library ``name`` with content ``data`` and its integrity record, each written atomically.
        Whatever was there (a link, another user's file) is replaced, not written through."""
        record = {"format": RECORD_FORMAT, "library": name, "size": len(data),
                  "sha256": hashlib.sha256(data).hexdigest()}
        lib_tmp = self.write_new(name, data)
        rec_tmp = self.write_new(name + RECORD_SUFFIX, (json.dumps(record) + "\n").encode())
        # Any interleaving with readers is safe: a library and a record that do not match are never loaded.
        self.discard(name)
        self.replace(lib_tmp, name)
        self.replace(rec_tmp, name + RECORD_SUFFIX)


class PackagedDirectory(Directory):
    """The read-only directory of libraries built with the installed package (``ptnative/prebuilt``), trusted as
    much as ptnative's own modules next to it: the directory and every file in it must be owned by the user, by
    root or by the owner of the package directory (whose Python code this process already runs), and neither may
    be writable by group or others nor be a symbolic link.  A library is used only through :meth:`read_verified`,
    which checks it against its integrity record; the cache then installs those bytes as its own (and checks them
    again when it loads them)."""

    def __init__(self, path: Path, package_owner: int):
        self.path = path
        self.owners = frozenset({os.geteuid(), 0, package_owner})
        try:
            self.fd = os.open(path, _DIR_FLAGS)
        except FileNotFoundError:
            raise Missing("is not there (ptnative was installed without prebuilt libraries)") from None
        except OSError as e:
            raise Untrusted("is a symbolic link" if e.errno == errno.ELOOP else f"cannot be opened ({e.strerror})") \
                from None
        st = os.fstat(self.fd)
        problem = None
        if st.st_uid not in self.owners:
            problem = f"is owned by {_user(st.st_uid)}, not by you, root or the package's owner"
        elif st.st_mode & 0o022:
            problem = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        if problem:
            os.close(self.fd)
            raise Untrusted(problem)

    def read_verified(self, name: str) -> bytes:
        """The bytes of library ``name``, read once and matching its integrity record (size, SHA-256);
        :class:`Missing` if it is not there, :class:`Untrusted` (with the reason) if it fails a check."""
        fd, st = self.open_checked(name)
        try:
            record = self.read_record(name)
            chunks, offset = [], 0
            while chunk := os.pread(fd, 1 << 20, offset):
                chunks.append(chunk)
                offset += len(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        if len(data) != record["size"]:
            raise Untrusted(f"has {len(data)} bytes but its integrity record says {record['size']} (truncated or "
                            "replaced)")
        if hashlib.sha256(data).hexdigest() != record["sha256"]:
            raise Untrusted("does not match the SHA-256 in its integrity record (modified or replaced)")
        return data


_verified: set[tuple] = set()


def _sha256_of_fd(fd: int) -> str:
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


# ELF header fields from e_type to e_shstrndx, and the program header fields (p_type, p_offset, p_filesz).
_ELF = {1: ("<HHIIIIIHHHHHH", "<II8xI", 52), 2: ("<HHIQQQIHHHHHH", "<I4xQ16xQ", 64)}
_ET_DYN, _PT_LOAD = 3, 1


def elf_problem(fd: int, size: int) -> str | None:
    """Why the file is not a complete little-endian ELF shared object, in words after "the library ..."; None if it
    is.  Every loadable segment must lie inside the file: ``dlopen`` maps them, and touching a page past the end of
    a truncated file kills the process with SIGBUS."""
    head = os.pread(fd, 64, 0)
    if len(head) < 16 or head[:4] != b"\x7fELF":
        return "is not an ELF shared library"
    cls = head[4]
    if cls not in _ELF or head[5] != 1 or len(head) < _ELF[cls][2]:
        return "is not a little-endian ELF file of this machine's kind"
    header, phdr, ehsize = _ELF[cls]
    (e_type, _, _, _, e_phoff, e_shoff, _, _, e_phentsize, e_phnum, e_shentsize, e_shnum, _) = struct.unpack_from(
        header, head, 16)
    if e_type != _ET_DYN:
        return f"is not an ELF shared library (ELF type {e_type})"
    if e_phnum == 0 or e_phentsize < struct.calcsize(phdr) or e_phoff + e_phnum * e_phentsize > size:
        return "is truncated or damaged (its program headers are missing)"
    if e_shnum and e_shoff + e_shnum * e_shentsize > size:
        return "is truncated (its section headers lie past the end of the file)"
    table = os.pread(fd, e_phnum * e_phentsize, e_phoff)
    if len(table) < e_phnum * e_phentsize:
        return "is truncated (its program headers lie past the end of the file)"
    for k in range(e_phnum):
        p_type, p_offset, p_filesz = struct.unpack_from(phdr, table, k * e_phentsize)
        if p_type == _PT_LOAD and p_offset + p_filesz > size:
            return "is truncated (a loadable segment lies past the end of the file)"
    return None


# Mach-O (macOS): 64-bit little-endian header fields from cputype to sizeofcmds, the load command's head, and a
# 64-bit segment's fileoff and filesize (after cmd, cmdsize, segname[16], vmaddr, vmsize).
_MH_MAGIC_64 = b"\xcf\xfa\xed\xfe"
_MH_OTHER = {b"\xce\xfa\xed\xfe": "a 32-bit Mach-O file", b"\xfe\xed\xfa\xcf": "a big-endian Mach-O file",
             b"\xfe\xed\xfa\xce": "a big-endian Mach-O file", b"\xca\xfe\xba\xbe": "a universal (fat) Mach-O file",
             b"\xca\xfe\xba\xbf": "a universal (fat) Mach-O file"}
_MH_HEADER, _MH_HEADER_SIZE = "<iiIII", 32
_MH_DYLIB, _MH_BUNDLE, _LC_SEGMENT_64 = 6, 8, 0x19
_MH_CPU = {"x86_64": 0x01000007, "arm64": 0x0100000C, "aarch64": 0x0100000C}


def macho_problem(fd: int, size: int, machine: str | None = None) -> str | None:
    """Why the file is not a complete 64-bit Mach-O dynamic library (or bundle) for ``machine`` (default: this
    one), in words after "the library ..."; None if it is.  As for ELF, every segment's file range must lie
    inside the file (``dlopen`` maps them).  A universal (fat) file is refused: ptnative builds for one
    architecture."""
    head = os.pread(fd, _MH_HEADER_SIZE, 0)
    if len(head) < 4 or (head[:4] != _MH_MAGIC_64 and head[:4] not in _MH_OTHER):
        return "is not a Mach-O dynamic library"
    if head[:4] != _MH_MAGIC_64:
        return f"is {_MH_OTHER[head[:4]]}, not a 64-bit little-endian Mach-O file of this machine's kind"
    if len(head) < _MH_HEADER_SIZE:
        return "is truncated (its Mach-O header is incomplete)"
    cputype, _, filetype, ncmds, sizeofcmds = struct.unpack_from(_MH_HEADER, head, 4)
    want = _MH_CPU.get(platform.machine() if machine is None else machine)
    if want is not None and cputype != want:
        return f"is a Mach-O file for another CPU (cputype {cputype:#x})"
    if filetype not in (_MH_DYLIB, _MH_BUNDLE):
        return f"is not a Mach-O dynamic library (file type {filetype})"
    if ncmds == 0 or _MH_HEADER_SIZE + sizeofcmds > size:
        return "is truncated or damaged (its load commands are missing)"
    table = os.pread(fd, sizeofcmds, _MH_HEADER_SIZE)
    if len(table) < sizeofcmds:
        return "is truncated (its load commands lie past the end of the file)"
    at = 0
    for _ in range(ncmds):
        if at + 8 > sizeofcmds:
            return "is damaged (its load commands overrun their table)"
        cmd, cmdsize = struct.unpack_from("<II", table, at)
        if cmdsize < 8 or at + cmdsize > sizeofcmds:
            return "is damaged (a load command has a bad size)"
        if cmd == _LC_SEGMENT_64:
            if cmdsize < 72:
                return "is damaged (a segment command is too short)"
            fileoff, filesize = struct.unpack_from("<QQ", table, at + 40)
            if fileoff + filesize > size:
                return "is truncated (a segment lies past the end of the file)"
        at += cmdsize
    return None


def library_problem(fd: int, size: int, system: str | None = None) -> str | None:
    """Why the file is not a complete shared library of this platform (``system``, default this one): Mach-O on
    macOS (:func:`macho_problem`), ELF elsewhere (:func:`elf_problem`); None if it is one."""
    if (platform.system() if system is None else system) == "Darwin":
        return macho_problem(fd, size)
    return elf_problem(fd, size)


def open_verified(directory: Directory, name: str) -> int:
    """A descriptor of library ``name`` in ``directory`` that passed every check (the caller owns it);
    :class:`Missing` or :class:`Untrusted` (with the reason) otherwise.  The content is hashed once per
    process per (file identity, record)."""
    fd, st = directory.open_checked(name)
    try:
        record = directory.read_record(name)
        if st.st_size != record["size"]:
            raise Untrusted(f"has {st.st_size} bytes but its integrity record says {record['size']} (truncated "
                            "or replaced)")
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, record["sha256"])
        if key not in _verified:
            if _sha256_of_fd(fd) != record["sha256"]:
                raise Untrusted("does not match the SHA-256 in its integrity record (modified or replaced)")
            problem = library_problem(fd, st.st_size)
            if problem:
                raise Untrusted(problem)
            _verified.add(key)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_output(fd: int, size: int) -> str | None:
    """Why a compiler's output cannot be installed (empty, not a complete shared library); None if it can."""
    if size == 0:
        return "is empty"
    return library_problem(fd, size)


def proc_fd_usable() -> bool:
    """Whether this system has ``/proc/self/fd`` (Linux: yes; macOS: no), through which a checked descriptor is
    loaded and the compiler reaches the checked cache directory."""
    return os.path.isdir(_PROC_FD)


def _identity(st: os.stat_result) -> tuple:
    return (stat.S_IFMT(st.st_mode), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _dlopen_path(fd: int, path: Path) -> ctypes.CDLL:
    """Without ``/proc/self/fd``: load ``path``, which must name the file open as ``fd`` (checked by the caller,
    under the cache's lock) unchanged just before and just after ``dlopen``; :class:`CacheError` if it does not
    (before: nothing was loaded; after: the library is left loaded but never used).  Closes ``fd``."""
    try:
        checked = _identity(os.fstat(fd))

        def same() -> bool:
            try:
                return _identity(os.stat(path, follow_symlinks=False)) == checked == _identity(os.fstat(fd))
            except OSError:
                return False

        if not same():
            raise CacheError(f"ptnative: the cached library {path} was replaced after it was checked; it was not "
                             "loaded. Another process of yours is writing to the kernel cache without its lock")
        lib = ctypes.CDLL(str(path))
        if not same():
            raise CacheError(f"ptnative: the cached library {path} was replaced while it was being loaded; it is "
                             "not used. Another process of yours is writing to the kernel cache without its lock")
        return lib
    finally:
        os.close(fd)


def dlopen_fd(fd: int, fallback_path: Path) -> ctypes.CDLL:
    """``dlopen`` the file open as ``fd``, taking ownership of ``fd``.  Loaded as ``/proc/self/fd/N``: exactly the
    checked inode, whatever the path names now.  The descriptor stays open while the library is loaded (for the
    life of the process), so that no other file gets that name; if another library was already loaded under the
    name (its owner closed the descriptor), the descriptor is duplicated to a fresh number first.  Without
    ``/proc/self/fd`` the checked path is loaded (the caller holds the cache's lock), if it still names the
    checked file before and after (:func:`_dlopen_path`).  ``OSError`` if ``dlopen`` fails."""
    if not proc_fd_usable():
        return _dlopen_path(fd, Path(fallback_path))
    fds = [fd]
    try:
        for _ in range(8):
            try:
                ctypes.CDLL(f"{_PROC_FD}/{fds[-1]}", mode=os.RTLD_NOLOAD)
            except OSError:
                break  # neither the name nor this inode is loaded yet: the name is free
            fds.append(os.dup(fds[-1]))
        lib = ctypes.CDLL(f"{_PROC_FD}/{fds[-1]}")
    except BaseException:
        for f in fds:
            os.close(f)
        raise
    for f in fds[:-1]:
        os.close(f)
    lib._ptnative_fd = fds[-1]
    return lib
