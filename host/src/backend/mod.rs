//! The ops interface and its backends (in progress)
