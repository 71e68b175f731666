//! The audited `unsafe` of the workspace's kernels: whether the CPU and the operating system give
//! this process Intel AMX tiles (`cpuid`, Linux's `arch_prctl`), and the micro-kernel that
//! multiplies packed bf16 panels on them (inline assembly: Rust's AMX intrinsics are unstable).
//! The micro-kernel's safe wrapper checks every address it will touch before it runs.

/// Elements (bf16) of one packed tile: 16 rows of 64 bytes.
pub(crate) const TILE: usize = 512;

/// Whether this process may run AMX bf16 instructions: the CPU has AMX-TILE and AMX-BF16, and
/// Linux granted the tile data state (asked once for the process).
pub(crate) fn granted() -> bool {
    static GRANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GRANTED.get_or_init(|| cpu_has_amx() && request_tile_state())
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn cpu_has_amx() -> bool {
    // Leaf 7, sub-leaf 0, EDX: bit 22 AMX-BF16, bit 24 AMX-TILE (Intel SDM vol. 2A, CPUID).
    #[allow(unsafe_code, unused_unsafe)]
    // SAFETY: `cpuid` exists on every x86-64 CPU and only reads identification registers.
    let leaf = unsafe { std::arch::x86_64::__cpuid_count(7, 0) };
    leaf.edx & (1 << 22) != 0 && leaf.edx & (1 << 24) != 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn cpu_has_amx() -> bool {
    false
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: without it the first tile
/// instruction faults (Linux's `Documentation/arch/x86/xstate.rst`).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    #[allow(unsafe_code)]
    // SAFETY: a system call with two integer arguments; it changes only which register states
    // the kernel will save for this process.
    let r = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    r == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_tile_state() -> bool {
    false
}

/// The tile configuration (palette 1): eight tiles of 16 rows × 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    Config(c)
};

/// `count` 32 × 32 blocks of `A·B`, one below the other: block `i` from the `i`-th packed
/// A panel of `a` (`steps` pairs of tiles each, `lib.rs`'s layout) and the packed B panel `b`
/// (`steps` pairs of tiles, its pairs as `u32`), written to `c` with `stride` elements between
/// rows: `c[(32 i + r)·stride + j]` for r, j < 32. The tiles are configured once for all.
///
/// # Panics
/// If `granted()` is false, or a slice is shorter than the blocks read or write.
pub(crate) fn blocks(
    a: &[u16],
    b: &[u32],
    steps: usize,
    count: usize,
    c: &mut [f32],
    stride: usize,
) {
    assert!(granted(), "AMX tiles are not available to this process");
    let panel = steps * 2 * TILE;
    assert!(steps > 0 && count > 0 && a.len() >= count * panel && b.len() >= steps * TILE);
    assert!(stride >= 32 && c.len() >= (32 * count - 1) * stride + 32);
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: the CPU and the kernel granted AMX (asserted above); block `i` reads `steps` pairs
    // of 1 KiB tiles from `a` at `i · panel` elements and from `b`, and writes 32 rows of 128
    // bytes `4·stride` bytes apart from `c` at `32 i · stride` elements: all within the slices
    // (asserted above). It touches no memory besides.
    unsafe {
        std::arch::asm!(
            "ldtilecfg [{cfg}]",
            "3:",
            "mov {bk}, {b}",
            "mov {n}, {steps}",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tileloadd tmm4, [{a} + {s64}*1]",
            "tileloadd tmm6, [{bk} + {s64}*1]",
            "tileloadd tmm5, [{a} + {s64}*1 + 1024]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tileloadd tmm7, [{bk} + {s64}*1 + 1024]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a}, 2048",
            "add {bk}, 2048",
            "dec {n}",
            "jnz 2b",
            "lea {c2}, [{c} + {cs}*8]",
            "lea {c2}, [{c2} + {cs}*8]",
            "tilestored [{c} + {cs}*1], tmm0",
            "tilestored [{c} + {cs}*1 + 64], tmm1",
            "tilestored [{c2} + {cs}*1], tmm2",
            "tilestored [{c2} + {cs}*1 + 64], tmm3",
            "lea {c}, [{c2} + {cs}*8]",
            "lea {c}, [{c} + {cs}*8]",
            "dec {count}",
            "jnz 3b",
            "tilerelease",
            cfg = in(reg) CONFIG.0.as_ptr(),
            a = inout(reg) a.as_ptr() => _,
            b = in(reg) b.as_ptr(),
            bk = out(reg) _,
            steps = in(reg) steps,
            n = out(reg) _,
            count = inout(reg) count => _,
            s64 = in(reg) 64usize,
            c = inout(reg) c.as_mut_ptr() => _,
            c2 = out(reg) _,
            cs = in(reg) 4 * stride,
            options(nostack),
        );
    }
}
