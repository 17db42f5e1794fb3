//! The pure-Rust core of syvain-training-data: everything the extension does that is not
//! turning values into Python objects. No module here knows of Python; the binding crate
//! (`_native`) wraps these in classes and functions, releasing the GIL through [`caller`].

pub mod caller;
pub mod classify;
pub mod codec;
pub mod counters;
pub mod credentials;
pub mod download;
pub mod error;
pub mod local_file;
pub mod local_put;
pub mod object_stores;
pub mod order;
pub mod policy;
pub mod process_bound;
pub mod retry_after;
pub mod runtime;
pub mod source;
pub mod storage;
pub mod stream;
pub mod upload;
pub mod warnings;
