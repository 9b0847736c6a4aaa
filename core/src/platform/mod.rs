//! Everything that depends on the kernel: who holds a lock, waiting for a
//! change, what filesystem a path is on, who a process is. Linux reads
//! `/proc`, inotify and `statfs` magic; another platform (macOS: kqueue,
//! `proc_pidinfo`) is another set of these modules behind the same names, and
//! where it cannot answer it says "unknown", never a guess.

#[cfg(not(target_os = "linux"))]
compile_error!("sidelease is built and tested on Linux only; see DESIGN §11");

#[cfg(feature = "postgres")]
pub(crate) mod clock;
pub mod fskind;
pub mod locks;
pub mod mounts;
pub mod notify;
pub mod process;
