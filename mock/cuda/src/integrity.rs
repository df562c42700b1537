//! The answer to the CUDA runtime's integrity check (slot 1 of the integrity-check export table,
//! `dark.rs`). The runtime hands the driver a version and the time, and compares the 16 bytes it
//! gets back with its own computation: without the right answer `cudaGetDeviceCount` fails with
//! `cudaErrorSystemNotReady`-class error 103, "integrity checks failed".
//!
//! The computation (as ZLUDA's `dark_api` documents it) is HMAC (RFC 2104) over MD2 (RFC 1319)
//! with a fixed 16-byte key, of: the driver's CUDA version, the version asked, the process id,
//! the calling thread (`pthread_self`, low 32 bits), the addresses of the runtime-interface table,
//! the integrity-check table and its function, the time; then per device its UUID and PCI
//! domain, bus and device numbers. Versions ending in 0 or 1 get fixed answers.

/// RFC 1319's substitution table ("random" permutation built from the digits of pi).
const PI_SUBST: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

/// MD2 (RFC 1319), fed byte by byte.
#[derive(Clone)]
struct Md2 {
    state: [u8; 48],
    checksum: [u8; 16],
    block: [u8; 16],
    len: usize,
}

impl Md2 {
    fn new() -> Self {
        Md2 {
            state: [0; 48],
            checksum: [0; 16],
            block: [0; 16],
            len: 0,
        }
    }

    fn compress(&mut self) {
        let mut l = self.checksum[15];
        for (c, b) in self.checksum.iter_mut().zip(self.block) {
            *c ^= PI_SUBST[usize::from(b ^ l)];
            l = *c;
        }
        for j in 0..16 {
            self.state[16 + j] = self.block[j];
            self.state[32 + j] = self.state[16 + j] ^ self.state[j];
        }
        let mut t = 0u8;
        for round in 0..18u8 {
            for x in self.state.iter_mut() {
                *x ^= PI_SUBST[usize::from(t)];
                t = *x;
            }
            t = t.wrapping_add(round);
        }
    }

    fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.block[self.len] = b;
            self.len += 1;
            if self.len == 16 {
                self.compress();
                self.len = 0;
            }
        }
    }

    fn finish(mut self) -> [u8; 16] {
        let pad = (16 - self.len) as u8;
        self.update(&vec![pad; usize::from(pad)]);
        let checksum = self.checksum;
        self.update(&checksum);
        let mut out = [0u8; 16];
        out.copy_from_slice(&self.state[..16]);
        out
    }
}

/// HMAC-MD2 with a key of exactly one block (16 bytes).
fn hmac_md2(key: &[u8; 16], message: &[u8]) -> [u8; 16] {
    let mut inner = Md2::new();
    inner.update(&key.map(|k| k ^ 0x36));
    inner.update(message);
    let inner = inner.finish();
    let mut outer = Md2::new();
    outer.update(&key.map(|k| k ^ 0x5c));
    outer.update(&inner);
    outer.finish()
}

const KEY: [u8; 16] = [
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
];

/// What the driver mixes in for one device.
pub(crate) struct DeviceId {
    pub(crate) uuid: [u8; 16],
    pub(crate) pci_domain: i32,
    pub(crate) pci_bus: i32,
    pub(crate) pci_device: i32,
}

/// Who asks and where the tables are.
pub(crate) struct Caller {
    pub(crate) driver_cuda_version: u32,
    pub(crate) version: u32,
    pub(crate) pid: u32,
    pub(crate) thread: u32,
    pub(crate) runtime_table: usize,
    pub(crate) check_table: usize,
    pub(crate) check_fn: usize,
    pub(crate) unix_seconds: u64,
}

/// The 16 bytes the runtime expects, as two native-endian words.
pub(crate) fn answer(c: &Caller, devices: &[DeviceId]) -> [u64; 2] {
    match c.version % 10 {
        0 => return [0x3341_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
        1 => return [0x1841_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
        _ => {}
    }
    let mut m = Vec::with_capacity(48 + 28 * devices.len());
    for w in [c.driver_cuda_version, c.version, c.pid, c.thread] {
        m.extend_from_slice(&w.to_ne_bytes());
    }
    for p in [c.runtime_table, c.check_table, c.check_fn] {
        m.extend_from_slice(&p.to_ne_bytes());
    }
    m.extend_from_slice(&c.unix_seconds.to_ne_bytes());
    for d in devices {
        m.extend_from_slice(&d.uuid);
        for v in [d.pci_domain, d.pci_bus, d.pci_device] {
            m.extend_from_slice(&v.to_ne_bytes());
        }
    }
    let h = hmac_md2(&KEY, &m);
    let (a, b) = h.split_at(8);
    [
        u64::from_ne_bytes(a.try_into().unwrap_or_default()),
        u64::from_ne_bytes(b.try_into().unwrap_or_default()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md2_hex(s: &str) -> String {
        let mut m = Md2::new();
        m.update(s.as_bytes());
        m.finish().iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn md2_rfc1319_vectors() {
        assert_eq!(md2_hex(""), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(md2_hex("a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
        assert_eq!(md2_hex("abc"), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(
            md2_hex(
                "12345678901234567890123456789012345678901234567890123456789012345678901234567890"
            ),
            "d5976f79d83d3a0dc9806c3c66f3efd8"
        );
    }

    #[test]
    fn fixed_answers_and_determinism() {
        let c = Caller {
            driver_cuda_version: 13000,
            version: 4,
            pid: 1,
            thread: 2,
            runtime_table: 3,
            check_table: 4,
            check_fn: 5,
            unix_seconds: 6,
        };
        assert_eq!(
            answer(&Caller { version: 10, ..c }, &[])[0],
            0x3341_181C_03CB_675C
        );
        let c = Caller { version: 4, ..c };
        let d = [DeviceId {
            uuid: [7; 16],
            pci_domain: 0,
            pci_bus: 0x18,
            pci_device: 0,
        }];
        assert_eq!(answer(&c, &d), answer(&c, &d));
        assert_ne!(answer(&c, &d), answer(&c, &[]));
    }
}
