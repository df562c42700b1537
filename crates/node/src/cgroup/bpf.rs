//! The `bpf(2)` calls of the device gate: load, attach (multi, or replacing a program), query the
//! programs attached to a cgroup, read a loaded program back. No policy here: what to load and
//! attach is [`super::gate_v2`]'s decision, the programs are [`super::program`]'s.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::program::{Insn, insn};

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("loading the cgroup device program: {source}{}", if log.is_empty() { String::new() } else { format!(" (verifier: {log})") })]
    Load { source: std::io::Error, log: String },
    #[error("attaching the device program to cgroup {cgroup}: {source}")]
    Attach {
        cgroup: String,
        source: std::io::Error,
    },
    #[error("querying device programs of cgroup {cgroup}: {source}")]
    Query {
        cgroup: String,
        source: std::io::Error,
    },
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_QUERY: libc::c_long = 16;
pub(super) const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

#[repr(C)]
#[derive(Default)]
struct ProgQueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
}

fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: attr is a live, properly sized repr(C) bpf_attr prefix; the kernel reads/writes at
    // most size_of::<T>() bytes of it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Load the program; returns its fd.
pub fn load(prog: &[Insn]) -> Result<OwnedFd, BpfError> {
    let license = c"GPL";
    let mut log = vec![0u8; 64 * 1024];
    let mut name = [0u8; 16];
    name[..11].copy_from_slice(b"gpufence_gt");
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: prog.len() as u32,
        insns: prog.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name: name,
        ..Default::default()
    };
    match sys_bpf(BPF_PROG_LOAD, &mut attr) {
        // SAFETY: a successful BPF_PROG_LOAD returns a new fd we own.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
        Err(source) => {
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let last = text.lines().rev().take(2).collect::<Vec<_>>().join(" / ");
            Err(BpfError::Load { source, log: last })
        }
    }
}

/// Attach `prog` to the cgroup directory `cgroup_fd` with `BPF_F_ALLOW_MULTI`.
pub fn attach(prog: &OwnedFd, cgroup_fd: &OwnedFd, cgroup: &str) -> Result<(), BpfError> {
    attach_raw(prog, cgroup_fd, None).map_err(|source| BpfError::Attach {
        cgroup: cgroup.to_string(),
        source,
    })
}

/// Attach `prog` (multi), in place of `replace` when given (`BPF_F_REPLACE`).
pub fn attach_raw(
    prog: &OwnedFd,
    cgroup_fd: &OwnedFd,
    replace: Option<&OwnedFd>,
) -> std::io::Result<()> {
    let mut attr = ProgAttachAttr {
        target_fd: cgroup_fd.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI | if replace.is_some() { BPF_F_REPLACE } else { 0 },
        replace_bpf_fd: replace.map_or(0, |r| r.as_raw_fd() as u32),
    };
    sys_bpf(BPF_PROG_ATTACH, &mut attr).map(drop)
}

/// Ids of the device programs attached to a cgroup (effective ones are not included).
pub fn query(cgroup_fd: &OwnedFd, cgroup: &str) -> Result<Vec<u32>, BpfError> {
    query_ids(cgroup_fd).map_err(|source| BpfError::Query {
        cgroup: cgroup.to_string(),
        source,
    })
}

/// [`query`] without the error context.
pub fn query_ids(cgroup_fd: &OwnedFd) -> std::io::Result<Vec<u32>> {
    let mut ids = vec![0u32; 64];
    let mut attr = ProgQueryAttr {
        target_fd: cgroup_fd.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        prog_ids: ids.as_mut_ptr() as u64,
        prog_cnt: ids.len() as u32,
        ..Default::default()
    };
    sys_bpf(BPF_PROG_QUERY, &mut attr)?;
    ids.truncate(attr.prog_cnt.min(64) as usize);
    Ok(ids)
}

const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_F_REPLACE: u32 = 4;

#[repr(C)]
#[derive(Default)]
struct GetFdByIdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct InfoByFdAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The head of `struct bpf_prog_info` (the kernel fills at most `info_len` bytes).
#[repr(C)]
#[derive(Default)]
struct ProgInfoHead {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
}

/// A loaded program by id.
pub fn prog_fd_by_id(id: u32) -> std::io::Result<OwnedFd> {
    let mut a = GetFdByIdAttr {
        id,
        ..Default::default()
    };
    // SAFETY: a successful BPF_PROG_GET_FD_BY_ID returns a new fd we own.
    sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut a).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The (translated) instructions of a loaded program.
pub fn prog_insns(fd: &OwnedFd) -> std::io::Result<Vec<Insn>> {
    let mut info = ProgInfoHead::default();
    let mut a = InfoByFdAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<ProgInfoHead>() as u32,
        info: &mut info as *mut ProgInfoHead as u64,
    };
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    let n = info.xlated_prog_len as usize / std::mem::size_of::<Insn>();
    if n == 0 || info.prog_type != BPF_PROG_TYPE_CGROUP_DEVICE {
        return Err(std::io::Error::other(
            "program instructions not readable (or not a device program)",
        ));
    }
    let mut insns = vec![insn(0, 0, 0, 0, 0); n];
    let mut info = ProgInfoHead {
        xlated_prog_len: (n * std::mem::size_of::<Insn>()) as u32,
        xlated_prog_insns: insns.as_mut_ptr() as u64,
        ..Default::default()
    };
    let mut a = InfoByFdAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<ProgInfoHead>() as u32,
        info: &mut info as *mut ProgInfoHead as u64,
    };
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    Ok(insns)
}
