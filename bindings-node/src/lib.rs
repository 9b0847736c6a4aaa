//! The native half of the `sidelease` npm package. `index.js` wraps it:
//! options, AbortSignal, `Symbol.dispose` and the error class live there.

mod elector;
mod error;
mod handles;
mod lease;
mod runtime;
mod wait;

pub use elector::*;
pub use handles::*;
pub use lease::*;
pub use wait::*;
