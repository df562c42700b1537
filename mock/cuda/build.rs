// The real library's DT_SONAME, so ldconfig (and the ldcache hook) create `libcuda.so.1` when
// the mock is installed as `libcuda.so.<driver version>`, and the shim's dlopen(RTLD_NOLOAD)
// lookup matches the loaded object by it.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // Like the real driver, internal calls (cuMemAllocAsync → cuMemAlloc_v2 here) stay inside
    // the library instead of going through the PLT, where a preloaded shim would see them twice.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
