// The real driver's SONAME is libcuda.so.1; loaders (and the shim's dlopen(RTLD_NOLOAD) lookup)
// match loaded objects by it.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
