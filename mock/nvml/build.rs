// The real library's DT_SONAME, so ldconfig (and the ldcache hook) create `libnvidia-ml.so.1`
// when the mock is installed as `libnvidia-ml.so.<driver version>`.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
