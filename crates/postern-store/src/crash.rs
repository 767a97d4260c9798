//! Crash points at the store's durable boundaries, for fault tests: with the `failpoints`
//! feature, `FAILPOINTS=store::commit::after::dispatched=return` (the `fail` crate's syntax)
//! aborts the process right there, as a power cut or SIGKILL would. Without the feature (every
//! normal build) a point is an empty function and `ENABLED` is false.

/// Whether this build has crash points at all.
pub const ENABLED: bool = cfg!(feature = "failpoints");

/// Aborts the process if the crash point `name` is armed; otherwise returns.
#[cfg(feature = "failpoints")]
pub fn point(name: &str) {
    if fail::eval(name, |_| ()).is_some() {
        // Printed, not logged: the process aborts on the next line, and only fault-test builds
        // have crash points at all.
        eprintln!("postern: crash point {name} reached: aborting");
        std::process::abort();
    }
}

#[cfg(not(feature = "failpoints"))]
pub fn point(_name: &str) {}
