//! The C ABI of sidelease. Conventions (rustls-ffi is the model):
//!
//! - Every fallible function returns a `sidelease_status`; results go through
//!   out-parameters, written only on success.
//! - No panic crosses the boundary ([`guard`]); a NULL argument returns
//!   `SIDELEASE_ERR_NULL_ARGUMENT`, never aborts.
//! - After a failure, the calling thread's last error (message, errno, holder
//!   record and holder PIDs) can be read without allocating.
//! - Objects are opaque; every `_free(NULL)` is a no-op; strings the library
//!   allocates are freed with `sidelease_string_free`, never `free()`.

#![allow(non_camel_case_types)]
// Every pointer argument is checked for NULL and documented in the header;
// the functions are `unsafe` to call from C by nature.
#![allow(clippy::missing_safety_doc)]

mod cancel;
mod elector;
mod error;
mod guard;
mod inspect;
mod lease;
mod options;
mod strings;
mod watch;

pub use cancel::*;
pub use elector::*;
pub use error::*;
pub use inspect::*;
pub use lease::*;
pub use options::*;
pub use strings::*;
pub use watch::*;
