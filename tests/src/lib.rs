//! Shared helpers of handoff's integration tests.
