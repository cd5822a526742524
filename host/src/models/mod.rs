//! Model executors (in progress)
