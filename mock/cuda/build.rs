// The real library's DT_SONAME, so ldconfig (and the ldcache hook) create `libcuda.so.1` when
// the mock is installed as `libcuda.so.<driver version>`.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
