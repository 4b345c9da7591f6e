//! Compiles the C++ guard (csrc/guard.cpp) that every PJRT call goes through: a C++
//! exception escaping a plugin is caught there and becomes an error, instead of
//! unwinding into Rust frames (which aborts the process). Needs a C++ compiler only;
//! no PJRT or XLA headers.

fn main() {
    println!("cargo:rerun-if-changed=csrc/guard.cpp");
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .std("c++17")
        .warnings(true)
        .extra_warnings(true)
        .file("csrc/guard.cpp")
        .compile("handoff_xla_guard");
}
