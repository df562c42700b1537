// The real driver's SONAME is libcuda.so.1; loaders (and the shim's dlopen(RTLD_NOLOAD) lookup)
// match loaded objects by it.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // Like the real driver, internal calls (cuMemAllocAsync → cuMemAlloc_v2 here) stay inside
    // the library instead of going through the PLT, where a preloaded shim would see them twice.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
