//! The native ld cache writer against the host's `ldconfig -r`, for the image families the
//! create path meets: Debian/Ubuntu multiarch, RHEL/UBI `lib64`, a glibc image without a cache,
//! and musl/Alpine.
//!
//! For each family the image's own cache is built by `ldconfig -r` ("the image build"); then
//! the reference is `ldconfig -r` once the driver libraries sit in their folder and the
//! gpufence drop-in names it (what the image's own `ldconfig` would make of the container), and
//! gpufence's result comes two ways: from the HOST library files before anything is mounted
//! (gpufence-runtime) and from scanning the folder once they are there (the hooks).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use gpufence::enter::ldcache::{Libraries, Outcome, known_libraries, update};
use gpufence::ldso::cache::{self, Cache};

/// The driver libraries: (file name, soname or None for a copy of a host library).
fn driver_files(dir: &Path, with_libm: bool) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    let mut out = Vec::new();
    for (file, soname) in [
        ("libcuda.so.580.65.06", "libcuda.so.1"),
        ("libnvidia-ml.so.580.65.06", "libnvidia-ml.so.1"),
    ] {
        let p = dir.join(file);
        std::fs::write(&p, gpufence::ldso::soname::minimal_shared_object(soname)).unwrap();
        out.push(p);
    }
    if !with_libm {
        return out;
    }
    // A real library whose soname the image also has in another folder: the driver's must come
    // first.
    let p = dir.join("libm.so.6");
    std::fs::copy("/lib/x86_64-linux-gnu/libm.so.6", &p).unwrap();
    out.push(p);
    out
}

fn copy_host_lib(name: &str, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(Path::new("/lib/x86_64-linux-gnu").join(name), to).unwrap();
}

fn ldconfig(root: &Path) {
    let (code, _, err) = common::run(Command::new("/sbin/ldconfig").arg("-r").arg(root));
    assert_eq!(code, 0, "ldconfig -r {}: {err}", root.display());
}

fn cp_tree(from: &Path, to: &Path) {
    let (code, _, err) = common::run(Command::new("cp").arg("-a").arg(from).arg(to));
    assert_eq!(code, 0, "{err}");
}

fn read_cache(root: &Path) -> (Vec<u8>, Cache) {
    let b = std::fs::read(root.join("etc/ld.so.cache")).unwrap();
    let c = cache::parse(&b).unwrap();
    (b, c)
}

/// An entry with its path resolved through the image's own symlinks (`/lib64` → `usr/lib64`).
fn canon(root: &Path, c: &Cache) -> Vec<(String, i32, u32, u64, String)> {
    c.entries
        .iter()
        .map(|e| {
            let v = String::from_utf8(e.value.clone()).unwrap();
            let p = Path::new(&v);
            let dir =
                std::fs::canonicalize(root.join(p.parent().unwrap().strip_prefix("/").unwrap()))
                    .unwrap();
            let rel = dir
                .strip_prefix(std::fs::canonicalize(root).unwrap())
                .unwrap();
            (
                String::from_utf8(e.key.clone()).unwrap(),
                e.flags,
                e.osversion,
                e.hwcap,
                format!(
                    "/{}/{}",
                    rel.display(),
                    p.file_name().unwrap().to_str().unwrap()
                ),
            )
        })
        .collect()
}

struct Family {
    scratch: PathBuf,
    image: PathBuf,
    folder: String,
    drivers: Vec<PathBuf>,
}

impl Family {
    fn rootfs(&self, name: &str) -> PathBuf {
        let r = self.scratch.join(name);
        cp_tree(&self.image, &r);
        r
    }
    fn mounts(&self) -> Vec<(String, PathBuf)> {
        self.drivers
            .iter()
            .map(|h| {
                (
                    format!(
                        "{}/{}",
                        self.folder,
                        h.file_name().unwrap().to_str().unwrap()
                    ),
                    h.clone(),
                )
            })
            .collect()
    }
    fn place_drivers(&self, root: &Path) {
        for (c, h) in self.mounts() {
            std::fs::copy(h, root.join(c.trim_start_matches('/'))).unwrap();
        }
    }
    /// (reference by ldconfig, gpufence from host files, gpufence by scanning).
    fn three(&self) -> (PathBuf, PathBuf, PathBuf) {
        let folders = vec![self.folder.clone()];
        let reference = self.rootfs("reference");
        self.place_drivers(&reference);
        let d = reference.join("etc/ld.so.conf.d");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("00-gpufence.conf"),
            format!(
                "# gpufence: driver libraries mounted into this container\n{}\n",
                self.folder
            ),
        )
        .unwrap();
        ldconfig(&reference);

        let known = self.rootfs("known");
        let o = update(
            &known,
            &folders,
            &Libraries::Known(known_libraries(&self.mounts())),
        )
        .unwrap();
        let n = self.drivers.len();
        assert!(
            matches!(o, Outcome::Written { added, .. } if added == n),
            "{o:?}"
        );

        let scanned = self.rootfs("scanned");
        self.place_drivers(&scanned);
        let o = update(&scanned, &folders, &Libraries::Scan).unwrap();
        assert!(matches!(o, Outcome::Written { .. }), "{o:?}");
        for r in [&reference, &known, &scanned] {
            for (link, target) in [
                ("libcuda.so.1", "libcuda.so.580.65.06"),
                ("libnvidia-ml.so.1", "libnvidia-ml.so.580.65.06"),
            ] {
                let p = r.join(self.folder.trim_start_matches('/')).join(link);
                assert_eq!(
                    std::fs::read_link(&p).unwrap(),
                    Path::new(target),
                    "{}",
                    p.display()
                );
            }
        }
        (reference, known, scanned)
    }
}

fn family(tag: &str, folder: &str, build: impl FnOnce(&Path)) -> Option<Family> {
    family_with(tag, folder, true, build)
}

fn family_with(
    tag: &str,
    folder: &str,
    with_libm: bool,
    build: impl FnOnce(&Path),
) -> Option<Family> {
    if common::skip_unless(&["ldconfig", "cp"]) {
        return None;
    }
    let scratch = common::scratch(tag);
    let image = scratch.join("image");
    build(&image);
    Some(Family {
        drivers: driver_files(&scratch.join("driver"), with_libm),
        scratch,
        image,
        folder: folder.to_string(),
    })
}

fn debian_image(root: &Path, with_cache: bool) {
    let lib = root.join("lib/x86_64-linux-gnu");
    let usr = root.join("usr/lib/x86_64-linux-gnu");
    for l in ["libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2"] {
        copy_host_lib(l, &lib.join(l));
    }
    let z = std::fs::read_dir("/lib/x86_64-linux-gnu")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .find(|n| n.starts_with("libz.so.1."))
        .unwrap();
    copy_host_lib(&z, &usr.join(&z));
    std::os::unix::fs::symlink(&z, usr.join("libz.so.1")).unwrap();
    std::fs::create_dir_all(root.join("lib64")).unwrap();
    std::os::unix::fs::symlink(
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        root.join("lib64/ld-linux-x86-64.so.2"),
    )
    .unwrap();
    let d = root.join("etc/ld.so.conf.d");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        root.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
    )
    .unwrap();
    std::fs::write(
        d.join("x86_64-linux-gnu.conf"),
        "# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n",
    )
    .unwrap();
    if with_cache {
        ldconfig(root);
    }
}

#[test]
fn debian_multiarch_byte_for_byte() {
    let Some(f) = family("ldcmp-deb", "/usr/lib/x86_64-linux-gnu", |r| {
        debian_image(r, true)
    }) else {
        return;
    };
    let (reference, known, scanned) = f.three();
    let (rb, rc) = read_cache(&reference);
    let (kb, kc) = read_cache(&known);
    let (sb, _) = read_cache(&scanned);
    assert_eq!(kc, rc, "entry for entry");
    assert_eq!(kb, rb, "byte for byte (from host files)");
    assert_eq!(sb, rb, "byte for byte (scanned)");
    // The driver's libm comes before the image's.
    let libm: Vec<_> = kc
        .entries
        .iter()
        .filter(|e| e.key == b"libm.so.6")
        .collect();
    assert_eq!(libm[0].value, b"/usr/lib/x86_64-linux-gnu/libm.so.6");
    assert_eq!(libm[1].value, b"/lib/x86_64-linux-gnu/libm.so.6");
    // Refreshing again changes nothing (a restarted container).
    update(
        &known,
        std::slice::from_ref(&f.folder),
        &Libraries::Known(known_libraries(&f.mounts())),
    )
    .unwrap();
    assert_eq!(read_cache(&known).0, kb, "idempotent");
}

#[test]
fn ubi_lib64_entry_for_entry() {
    // (No libm among the driver's files here: it would replace the image's own in /usr/lib64.)
    let Some(f) = family_with("ldcmp-ubi", "/usr/lib64", false, |r| {
        let lib = r.join("usr/lib64");
        for l in ["libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2"] {
            copy_host_lib(l, &lib.join(l));
        }
        std::os::unix::fs::symlink("usr/lib64", r.join("lib64")).unwrap();
        let d = r.join("etc/ld.so.conf.d");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            r.join("etc/ld.so.conf"),
            "include /etc/ld.so.conf.d/*.conf\n",
        )
        .unwrap();
        // UBI's own ldconfig has /lib64 and /usr/lib64 built in; the host's (Debian) does not.
        std::fs::write(d.join("zz-lib64.conf"), "/lib64\n/usr/lib64\n").unwrap();
        ldconfig(r);
    }) else {
        return;
    };
    let (reference, known, scanned) = f.three();
    let (_, rc) = read_cache(&reference);
    let (_, kc) = read_cache(&known);
    let (_, sc) = read_cache(&scanned);
    // ldconfig re-indexes the image under the drop-in's spelling (/usr/lib64); gpufence keeps
    // the image's entries as they were (/lib64): the same files, names, flags and order.
    assert_eq!(canon(&known, &kc), canon(&reference, &rc));
    assert_eq!(canon(&scanned, &sc), canon(&reference, &rc));
    assert!(
        kc.entries
            .iter()
            .any(|e| e.value == b"/usr/lib64/libcuda.so.1")
    );
}

#[test]
fn glibc_image_without_a_cache_gets_the_driver_entries() {
    let Some(f) = family("ldcmp-nocache", "/usr/lib/x86_64-linux-gnu", |r| {
        debian_image(r, false)
    }) else {
        return;
    };
    let (reference, known, scanned) = f.three();
    let (_, rc) = read_cache(&reference);
    let (_, kc) = read_cache(&known);
    let (_, sc) = read_cache(&scanned);
    // No image cache to keep: ld.so finds the image's libraries in its default directories as
    // before; the cache holds the driver's, exactly as ldconfig lists them.
    let sonames: Vec<&[u8]> = vec![b"libcuda.so.1", b"libnvidia-ml.so.1", b"libm.so.6"];
    let driver_part: Vec<_> = rc
        .entries
        .iter()
        .filter(|e| sonames.contains(&e.key.as_slice()) && e.value.starts_with(f.folder.as_bytes()))
        .cloned()
        .collect();
    assert_eq!(kc.entries, driver_part);
    // Scanning also indexes what else lives in the folder (the image's libz), like ldconfig.
    assert!(sc.entries.iter().any(|e| e.key == b"libz.so.1"));
    assert!(driver_part.iter().all(|e| sc.entries.contains(e)));
}

#[test]
fn musl_image_is_left_alone() {
    let Some(f) = family("ldcmp-musl", "/usr/lib", |r| {
        std::fs::create_dir_all(r.join("lib")).unwrap();
        std::fs::create_dir_all(r.join("etc")).unwrap();
        std::fs::copy("/bin/busybox", r.join("lib/ld-musl-x86_64.so.1")).unwrap();
        std::fs::write(r.join("etc/ld-musl-x86_64.path"), "/lib\n/usr/lib\n").unwrap();
    }) else {
        return;
    };
    let root = f.rootfs("known");
    let before = common::digest(&root);
    let o = update(
        &root,
        std::slice::from_ref(&f.folder),
        &Libraries::Known(known_libraries(&f.mounts())),
    )
    .unwrap();
    assert_eq!(o, Outcome::Musl);
    assert_eq!(
        common::digest(&root),
        before,
        "nothing written into a musl image"
    );
}

#[test]
fn malformed_image_cache_is_replaced_with_the_driver_entries() {
    let Some(f) = family("ldcmp-bad", "/usr/lib/x86_64-linux-gnu", |r| {
        debian_image(r, false)
    }) else {
        return;
    };
    let root = f.rootfs("known");
    let mut bad = b"glibc-ld.so.cache1.1".to_vec();
    bad.extend_from_slice(&[0xff; 40]);
    std::fs::write(root.join("etc/ld.so.cache"), &bad).unwrap();
    let o = update(
        &root,
        std::slice::from_ref(&f.folder),
        &Libraries::Known(known_libraries(&f.mounts())),
    )
    .unwrap();
    let Outcome::Written { image_cache, .. } = o else {
        panic!("{o:?}")
    };
    assert!(image_cache.starts_with("malformed"), "{image_cache}");
    let (_, c) = read_cache(&root);
    assert_eq!(c.entries.len(), 3);
}
