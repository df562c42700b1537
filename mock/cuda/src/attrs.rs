//! Device attributes of the GPU the simulated node pretends to be: an H100 SXM5 80GB (compute
//! capability 9.0, 132 multiprocessors), the values `cuDeviceGetAttribute` gives on the real
//! card with a 580 driver. The runtime builds `cudaDeviceProp` from them (`cudaGetDeviceProperties`,
//! `torch.cuda.get_device_properties`, CuPy's `getDeviceProperties`).

use std::ffi::c_int;

use crate::driver::Device;

/// The largest `CUdevice_attribute` a 13.0 driver knows; past it the driver answers
/// `CUDA_ERROR_INVALID_VALUE`.
pub(crate) const MAX_ATTRIBUTE: c_int = 147;

/// The value of `attrib` on `d` (`sm_count`: the multiprocessors this process sees); `None` for
/// an attribute the driver does not know.
pub(crate) fn value(attrib: c_int, d: &Device, sm_count: c_int) -> Option<c_int> {
    let (pci_domain, pci_bus, pci_device) = d.pci;
    Some(match attrib {
        1..=3 => 1024,                // max threads per block, block dim x, y
        4 => 64,                      // block dim z
        5 => i32::MAX,                // grid dim x
        6 | 7 => 65535,               // grid dim y, z
        8 => 49152,                   // shared memory per block
        9 => 65536,                   // total constant memory
        10 => 32,                     // warp size
        11 => i32::MAX,               // max pitch
        12 => 65536,                  // registers per block
        13 => 1_980_000,              // clock rate (kHz)
        14 | 30 => 512,               // texture, surface alignment
        15 => 1,                      // gpu overlap
        16 => sm_count,               // multiprocessor count
        17 | 18 => 0,                 // kernel exec timeout, integrated
        19 => 1,                      // can map host memory
        20 => 0,                      // compute mode: default
        21 | 22 | 56 | 70 => 131_072, // 1D/2D texture width, 2D surface width, 2D linear width
        23 | 57 => 65536,             // 2D texture / surface height
        24..=26 | 58..=60 => 16384,   // 3D texture / surface extents
        27 | 28 | 42 | 45 | 46 | 52 | 53 | 55 | 61 | 63 | 64 | 66 | 67 | 73 | 74 | 77 => 32768,
        29 | 43 | 62 | 65 => 2048, // layered layers
        31 | 32 => 1,              // concurrent kernels, ECC enabled
        33 => pci_bus,
        34 => pci_device,
        35 => 0,          // TCC driver
        36 => 2_619_000,  // memory clock rate (kHz)
        37 => 5120,       // memory bus width (bits)
        38 => 52_428_800, // L2 cache size
        39 => 2048,       // threads per multiprocessor
        40 => 3,          // async engines
        41 | 44 => 1,     // unified addressing, 2D gather
        47 | 48 => 8192,  // 3D texture alternate width, height
        49 => 32768,      // 3D texture alternate depth
        50 => pci_domain,
        51 => 32,                 // texture pitch alignment
        54 | 68 => 2046,          // cubemap layered layers
        69 => 268_435_456,        // 1D linear texture width
        71 => 65000,              // 2D linear height
        72 => 2_097_120,          // 2D linear pitch
        75 => 9,                  // compute capability major
        76 => 0,                  // compute capability minor
        78..=80 => 1,             // stream priorities, global and local L1
        81 => 233_472,            // shared memory per multiprocessor
        82 => 65536,              // registers per multiprocessor
        83 => 1,                  // managed memory
        84..=86 => 0,             // multi-GPU board, its group, host native atomics
        87 => 2,                  // single to double precision ratio
        88 => 0,                  // pageable memory access
        89..=91 => 1, // concurrent managed access, preemption, host pointer for registered memory
        92..=94 => 0, // stream memory operations (v1, removed)
        95 | 96 => 1, // cooperative launch (multi-device)
        97 => 232_448, // shared memory per block opt-in
        98 => 0,      // can flush remote writes
        99 => 1,      // host register supported
        100 | 101 => 0, // pageable access through host page tables, direct managed access
        102 | 103 => 1, // virtual memory management, POSIX file descriptor handles
        104 | 105 => 0, // Win32 handles
        106 => 32,    // blocks per multiprocessor
        107 => 1,     // generic compression
        108 => 39_321_600, // persisting L2 cache
        109 => 134_213_632, // access policy window
        110 => 1,     // GPUDirect RDMA with VMM
        111 => 1024,  // reserved shared memory per block
        112..=116 => 1, // sparse arrays, read-only host register, timeline semaphores, pools, RDMA
        117 => 1,     // RDMA flush writes options
        118 => 0,     // RDMA writes ordering
        119 => 1,     // pool handle types: POSIX fd
        120..=125 => 1, // clusters, deferred mapping, 64-bit stream mem ops, wait NOR, dma-buf, IPC events
        126 => 4,       // memory sync domains
        127 => 1,       // tensor map access
        128 => 0,       // fabric handles
        129 => 1,       // unified function pointers
        130 => 0,       // NUMA config: none
        131 => -1,      // NUMA id
        132 | 133 => 0, // multicast, MPS enabled
        134 => -1,      // host NUMA id
        135..=138 => 0, // D3D12/Vulkan CIG, decompression
        139 => 0x2330_10de, // PCI device id (H100 SXM5 80GB)
        140 => 0x16c1_10de, // PCI subsystem id
        141..=MAX_ATTRIBUTE => 0, // host NUMA / host pools / host VMM / dma-buf host allocations
        _ => return None,
    })
}
