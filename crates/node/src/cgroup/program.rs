//! cgroup v2 device gate: a `BPF_PROG_TYPE_CGROUP_DEVICE` program assembled by hand and attached
//! with `BPF_F_ALLOW_MULTI` next to the runtime's own program.
//!
//! With multi-attach every attached program must allow an access, so this program cannot widen
//! what the runtime allows; it narrows. It allows everything except GPU-class character devices
//! (the "gated" majors: 195 and the dynamic `nvidia-*` majors), and among those only the granted
//! nodes with the granted access. On its own it therefore denies a GPU that was not granted and
//! allows a granted one, whatever the runtime's rules say.
//!
//! Program (registers as the verifier sees them, `r1` = `struct bpf_cgroup_dev_ctx *`):
//! ```text
//!   r2 = ctx->access_type & 0xffff      ; BPF_DEVCG_DEV_CHAR = 2, BLOCK = 1
//!   r5 = ctx->access_type >> 16         ; MKNOD = 1, READ = 2, WRITE = 4
//!   r3 = ctx->major ; r4 = ctx->minor
//!   for each granted (type, major, minor, access):
//!       if r2 == type && r3 == major && r4 == minor && (r5 & ~access) == 0: return 1
//!   if r2 != CHAR: return 1
//!   for each gated major G: if r3 == G: return 0
//!   return 1
//! ```

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    /// dst_reg (low nibble) | src_reg (high nibble).
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

const BPF_LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const BPF_ALU64_AND_K: u8 = 0x57;
const BPF_ALU64_RSH_K: u8 = 0x77;
const BPF_ALU64_MOV_K: u8 = 0xb7;
const BPF_ALU64_MOV_X: u8 = 0xbf;
const BPF_JMP_JNE_K: u8 = 0x55;
const BPF_JMP_JEQ_K: u8 = 0x15;
const BPF_JMP_EXIT: u8 = 0x95;

/// `BPF_DEVCG_DEV_BLOCK` / `BPF_DEVCG_DEV_CHAR`.
pub const DEV_BLOCK: i32 = 1;
pub const DEV_CHAR: i32 = 2;
/// `BPF_DEVCG_ACC_*`.
pub const ACC_MKNOD: i32 = 1;
pub const ACC_READ: i32 = 2;
pub const ACC_WRITE: i32 = 4;

pub(crate) fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (dst & 0x0f) | ((src & 0x0f) << 4),
        off,
        imm,
    }
}

/// One granted device for the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    /// `DEV_CHAR` or `DEV_BLOCK`.
    pub dev_type: i32,
    pub major: u32,
    pub minor: u32,
    /// Bit set of `ACC_*`.
    pub access: i32,
}

impl Grant {
    /// From a cgroup rule (`c 195:0 rw`).
    pub fn from_rule(r: &crate::plan::CgroupRule) -> Option<Grant> {
        let dev_type = match r.kind {
            'c' => DEV_CHAR,
            'b' => DEV_BLOCK,
            _ => return None,
        };
        let mut access = 0;
        for ch in r.access.chars() {
            access |= match ch {
                'r' => ACC_READ,
                'w' => ACC_WRITE,
                'm' => ACC_MKNOD,
                _ => return None,
            };
        }
        Some(Grant {
            dev_type,
            major: r.major,
            minor: r.minor,
            access,
        })
    }
}

/// Load the device context into r2 (type), r5 (access), r3 (major), r4 (minor), then one
/// 8-instruction block per grant that returns 1 (allow) when type, major, minor match and the
/// requested access is within the grant; a failed test falls through to the next block.
/// r1 (the context) is left intact for code that follows.
fn grant_prefix(grants: &[Grant]) -> Vec<Insn> {
    let mut p = vec![
        insn(BPF_LDX_MEM_W, 2, 1, 0, 0),
        insn(BPF_ALU64_AND_K, 2, 0, 0, 0xffff),
        insn(BPF_LDX_MEM_W, 5, 1, 0, 0),
        insn(BPF_ALU64_RSH_K, 5, 0, 0, 16),
        insn(BPF_LDX_MEM_W, 3, 1, 4, 0),
        insn(BPF_LDX_MEM_W, 4, 1, 8, 0),
    ];
    for g in grants {
        const L: i16 = 8;
        p.extend([
            insn(BPF_JMP_JNE_K, 2, 0, L - 1, g.dev_type),
            insn(BPF_JMP_JNE_K, 3, 0, L - 2, g.major as i32),
            insn(BPF_JMP_JNE_K, 4, 0, L - 3, g.minor as i32),
            insn(BPF_ALU64_MOV_X, 6, 5, 0, 0),
            insn(BPF_ALU64_AND_K, 6, 0, 0, !g.access & 0x7),
            insn(BPF_JMP_JNE_K, 6, 0, L - 6, 0),
            insn(BPF_ALU64_MOV_K, 0, 0, 0, 1),
            insn(BPF_JMP_EXIT, 0, 0, 0, 0),
        ]);
    }
    p
}

/// Assemble the gate program. `gated_majors` are the character-device majors only granted
/// nodes may use.
pub fn build_program(grants: &[Grant], gated_majors: &[u32]) -> Vec<Insn> {
    let mut p = grant_prefix(grants);
    let mut majors: Vec<u32> = gated_majors.to_vec();
    majors.sort_unstable();
    majors.dedup();
    let n = majors.len() as i16;
    // if type != CHAR: jump to "allow" (skip the n major tests).
    p.push(insn(BPF_JMP_JNE_K, 2, 0, n, DEV_CHAR));
    for (i, m) in majors.iter().enumerate() {
        // jump to "deny": past the remaining tests and the 2-instruction allow block.
        let remaining = n - 1 - i as i16;
        p.push(insn(BPF_JMP_JEQ_K, 3, 0, remaining + 2, *m as i32));
    }
    p.extend([
        insn(BPF_ALU64_MOV_K, 0, 0, 0, 1),
        insn(BPF_JMP_EXIT, 0, 0, 0, 0),
        insn(BPF_ALU64_MOV_K, 0, 0, 0, 0),
        insn(BPF_JMP_EXIT, 0, 0, 0, 0),
    ]);
    p
}

/// Interpret the program for one access (the tests use this to check the assembly).
pub fn evaluate(prog: &[Insn], dev_type: i32, access: i32, major: u32, minor: u32) -> Option<u64> {
    let ctx = [((access as u32) << 16) | dev_type as u32, major, minor];
    let mut r = [0u64; 11];
    let mut pc = 0usize;
    for _ in 0..10_000 {
        let i = prog.get(pc)?;
        let dst = (i.regs & 0x0f) as usize;
        let src = (i.regs >> 4) as usize;
        let mut next = pc + 1;
        match i.code {
            BPF_LDX_MEM_W => r[dst] = u64::from(*ctx.get((i.off / 4) as usize)?),
            BPF_ALU64_AND_K => r[dst] &= i.imm as i64 as u64,
            BPF_ALU64_RSH_K => r[dst] >>= i.imm,
            BPF_ALU64_MOV_K => r[dst] = i.imm as i64 as u64,
            BPF_ALU64_MOV_X => r[dst] = r[src],
            BPF_JMP_JNE_K | BPF_JMP_JEQ_K => {
                let eq = r[dst] == i.imm as i64 as u64;
                if eq == (i.code == BPF_JMP_JEQ_K) {
                    next = (pc as i64 + 1 + i64::from(i.off)) as usize;
                }
            }
            BPF_JMP_EXIT => return Some(r[0]),
            _ => return None,
        }
        pc = next;
    }
    None
}

/// Only plain device-rule code can be re-loaded from its translated form: context loads,
/// ALU, jumps and exit. Helper calls, map references and anything else are refused.
pub fn reloadable(p: &[Insn]) -> bool {
    p.iter().all(|i| {
        let class = i.code & 0x07;
        match class {
            0x01 => matches!(i.code, 0x61 | 0x69 | 0x71 | 0x79) && (i.regs >> 4) == 1,
            0x04 | 0x07 => true,
            0x05 | 0x06 => i.code != 0x85 && i.code != 0x8d,
            _ => false,
        }
    })
}

/// `prefix` (granted nodes allowed) followed by the original program: granted nodes are
/// allowed, everything else decided by the original. Registers r2–r6 are scratch for the
/// prefix; r1 (the context) is left intact for the original code.
pub fn widen(original: &[Insn], grants: &[Grant]) -> Vec<Insn> {
    let mut p = grant_prefix(grants);
    p.extend_from_slice(original);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(major: u32, minor: u32) -> Grant {
        Grant {
            dev_type: DEV_CHAR,
            major,
            minor,
            access: ACC_READ | ACC_WRITE,
        }
    }

    #[test]
    fn gate_allows_granted_denies_other_gpus_allows_rest() {
        let p = build_program(&[g(195, 0), g(195, 255), g(508, 0)], &[195, 508, 509]);
        let rw = ACC_READ | ACC_WRITE;
        assert_eq!(evaluate(&p, DEV_CHAR, rw, 195, 0), Some(1));
        assert_eq!(evaluate(&p, DEV_CHAR, ACC_READ, 195, 0), Some(1));
        assert_eq!(evaluate(&p, DEV_CHAR, rw, 195, 255), Some(1));
        assert_eq!(evaluate(&p, DEV_CHAR, rw, 508, 0), Some(1));
        // not granted: another GPU, mknod of the granted one, uvm-tools, a caps node
        assert_eq!(evaluate(&p, DEV_CHAR, rw, 195, 1), Some(0));
        assert_eq!(evaluate(&p, DEV_CHAR, ACC_MKNOD, 195, 0), Some(0));
        assert_eq!(evaluate(&p, DEV_CHAR, rw, 508, 1), Some(0));
        assert_eq!(evaluate(&p, DEV_CHAR, ACC_READ, 509, 3), Some(0));
        // everything else is left to the runtime's rules
        assert_eq!(evaluate(&p, DEV_CHAR, rw, 1, 3), Some(1));
        assert_eq!(evaluate(&p, DEV_CHAR, ACC_MKNOD, 5, 1), Some(1));
        assert_eq!(evaluate(&p, DEV_BLOCK, rw, 195, 1), Some(1));
    }

    #[test]
    fn no_grants_denies_every_gated_major() {
        let p = build_program(&[], &[195]);
        assert_eq!(evaluate(&p, DEV_CHAR, ACC_READ, 195, 0), Some(0));
        assert_eq!(evaluate(&p, DEV_CHAR, ACC_READ, 10, 200), Some(1));
        let p = build_program(&[], &[]);
        assert_eq!(evaluate(&p, DEV_CHAR, ACC_READ, 195, 0), Some(1));
    }

    #[test]
    fn widen_allows_grants_then_defers_to_original() {
        // "Runtime" program: deny every GPU-class access.
        let original = build_program(&[], &[195]);
        let p = widen(&original, &[g(195, 0)]);
        let rw = ACC_READ | ACC_WRITE;
        assert_eq!(evaluate(&p, DEV_CHAR, rw, 195, 0), Some(1));
        assert_eq!(evaluate(&p, DEV_CHAR, rw, 195, 1), Some(0));
        assert_eq!(evaluate(&p, DEV_CHAR, rw, 1, 3), Some(1));
        assert!(reloadable(&p));
    }

    #[test]
    fn grant_from_rule() {
        let r = crate::plan::CgroupRule {
            kind: 'c',
            major: 195,
            minor: 3,
            access: "rw".into(),
        };
        assert_eq!(Grant::from_rule(&r), Some(g(195, 3)));
        let bad = crate::plan::CgroupRule {
            access: "rx".into(),
            ..r
        };
        assert_eq!(Grant::from_rule(&bad), None);
    }

    proptest::proptest! {
        #[test]
        fn program_matches_model(
            grants in proptest::collection::vec((0u32..4, 0u32..4, 1i32..8), 0..6),
            gated in proptest::collection::vec(0u32..6, 0..4),
            t in 1i32..3, acc in 1i32..8, major in 0u32..6, minor in 0u32..4,
        ) {
            let grants: Vec<Grant> = grants.into_iter().map(|(ma, mi, a)| Grant {
                dev_type: DEV_CHAR, major: ma, minor: mi, access: a }).collect();
            let p = build_program(&grants, &gated);
            let granted = grants.iter().any(|g| g.dev_type == t && g.major == major
                && g.minor == minor && (acc & !g.access) == 0);
            let want = if granted || t != DEV_CHAR || !gated.contains(&major) { 1 } else { 0 };
            proptest::prop_assert_eq!(evaluate(&p, t, acc, major, minor), Some(want));
        }
    }
}
