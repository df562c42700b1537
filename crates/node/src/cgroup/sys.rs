//! The privileged calls of device-cgroup enforcement, behind one small trait so that what they do — and in
//! which order — is unit-tested without root: [`LinuxSys`] makes the calls, [`RecordingSys`]
//! records them (and can be told to fail one), as youki's `libcontainer/src/syscall/` does.
//!
//! The trait is deliberately narrow: one method per kernel operation, no policy. The policy (what
//! to write, in which order, what to refuse) lives in the callers and is what the tests check.

use std::cell::RefCell;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::bpf::{self, BpfError};
use super::program::Insn;

/// The kernel operations of device-cgroup enforcement.
pub trait CgroupSys {
    /// Open a cgroup directory (never following a symlink at its last component).
    fn open_cgroup(&self, dir: &Path) -> Result<OwnedFd, Errno>;
    /// One `write(2)` of `line` to the control file `file` of the cgroup `dir` (the kernel
    /// parses one device rule per write).
    fn write_cgroup(&self, dir: &OwnedFd, file: &str, line: &str) -> std::io::Result<()>;
    /// Ids of the device programs attached to the cgroup.
    fn bpf_query(&self, cgroup: &OwnedFd) -> std::io::Result<Vec<u32>>;
    /// An attached program by id, with its (translated) instructions.
    fn bpf_program(&self, id: u32) -> std::io::Result<(OwnedFd, Vec<Insn>)>;
    /// Load a device program.
    fn bpf_load(&self, prog: &[Insn]) -> Result<OwnedFd, BpfError>;
    /// Attach `prog` to the cgroup (multi), replacing `replace` when given.
    fn bpf_attach(
        &self,
        prog: &OwnedFd,
        cgroup: &OwnedFd,
        replace: Option<&OwnedFd>,
    ) -> std::io::Result<()>;
}

/// The real calls.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxSys;

impl CgroupSys for LinuxSys {
    fn open_cgroup(&self, dir: &Path) -> Result<OwnedFd, Errno> {
        nix::fcntl::open(
            dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    }

    fn write_cgroup(&self, dir: &OwnedFd, file: &str, line: &str) -> std::io::Result<()> {
        let fd = nix::fcntl::openat(
            dir,
            file,
            OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        std::fs::File::from(fd).write_all(line.as_bytes())
    }

    fn bpf_query(&self, cgroup: &OwnedFd) -> std::io::Result<Vec<u32>> {
        bpf::query_ids(cgroup)
    }

    fn bpf_program(&self, id: u32) -> std::io::Result<(OwnedFd, Vec<Insn>)> {
        let fd = bpf::prog_fd_by_id(id)?;
        let insns = bpf::prog_insns(&fd)?;
        Ok((fd, insns))
    }

    fn bpf_load(&self, prog: &[Insn]) -> Result<OwnedFd, BpfError> {
        bpf::load(prog)
    }

    fn bpf_attach(
        &self,
        prog: &OwnedFd,
        cgroup: &OwnedFd,
        replace: Option<&OwnedFd>,
    ) -> std::io::Result<()> {
        bpf::attach_raw(prog, cgroup, replace)
    }
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    OpenCgroup(PathBuf),
    WriteCgroup { file: String, line: String },
    BpfQuery,
    BpfProgram(u32),
    BpfLoad { insns: usize },
    BpfAttach { replace: bool },
}

/// A fake that records every call; cgroup "fds" are `/dev/null` handles. Programs "attached"
/// before the test starts are given by [`RecordingSys::with_programs`].
#[derive(Debug, Default)]
pub struct RecordingSys {
    calls: RefCell<Vec<Call>>,
    programs: Vec<(u32, Vec<Insn>)>,
    /// Fail the first call equal to this one (with EPERM).
    fail: Option<Call>,
}

impl RecordingSys {
    pub fn new() -> RecordingSys {
        RecordingSys::default()
    }

    /// Programs already attached to every cgroup (the runtime's).
    pub fn with_programs(mut self, programs: Vec<(u32, Vec<Insn>)>) -> RecordingSys {
        self.programs = programs;
        self
    }

    /// Make `call` fail.
    pub fn failing(mut self, call: Call) -> RecordingSys {
        self.fail = Some(call);
        self
    }

    /// The calls so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.borrow().clone()
    }

    fn record(&self, c: Call) -> std::io::Result<OwnedFd> {
        let fails = self.fail.as_ref() == Some(&c);
        self.calls.borrow_mut().push(c);
        if fails {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
        std::fs::File::open("/dev/null").map(OwnedFd::from)
    }
}

impl CgroupSys for RecordingSys {
    fn open_cgroup(&self, dir: &Path) -> Result<OwnedFd, Errno> {
        self.record(Call::OpenCgroup(dir.to_path_buf()))
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
    }

    fn write_cgroup(&self, _dir: &OwnedFd, file: &str, line: &str) -> std::io::Result<()> {
        self.record(Call::WriteCgroup {
            file: file.to_string(),
            line: line.to_string(),
        })
        .map(drop)
    }

    fn bpf_query(&self, _cgroup: &OwnedFd) -> std::io::Result<Vec<u32>> {
        self.record(Call::BpfQuery)?;
        Ok(self.programs.iter().map(|(id, _)| *id).collect())
    }

    fn bpf_program(&self, id: u32) -> std::io::Result<(OwnedFd, Vec<Insn>)> {
        let fd = self.record(Call::BpfProgram(id))?;
        let insns = self
            .programs
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, p)| p.clone())
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOENT))?;
        Ok((fd, insns))
    }

    fn bpf_load(&self, prog: &[Insn]) -> Result<OwnedFd, BpfError> {
        self.record(Call::BpfLoad { insns: prog.len() })
            .map_err(|source| BpfError::Load {
                source,
                log: String::new(),
            })
    }

    fn bpf_attach(
        &self,
        _prog: &OwnedFd,
        _cgroup: &OwnedFd,
        replace: Option<&OwnedFd>,
    ) -> std::io::Result<()> {
        self.record(Call::BpfAttach {
            replace: replace.is_some(),
        })
        .map(drop)
    }
}
