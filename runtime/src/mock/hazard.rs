//! What the mock's checker reports.

use std::fmt;

/// An operation in the simulated program: a kernel, or a host action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpRef {
    /// The kernel's name, or what the host did (`host write`, `release`).
    pub name: String,
    /// Where it ran: `mock:0/producer`, or `host`.
    pub on: String,
}

impl fmt::Display for OpRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` on {}", self.name, self.on)
    }
}

/// The kinds of hazard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HazardKind {
    /// A read not ordered after the write it must see.
    UnorderedRead,
    /// A write not ordered after an earlier read or write of the same bytes.
    WriteRace,
    /// Memory released while an access to it is not known to be complete.
    ReleaseRace,
    /// An access to memory after its release.
    UseAfterRelease,
}

/// A hazard, with both operations named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hazard {
    /// What went wrong.
    pub kind: HazardKind,
    /// The buffer's name.
    pub buffer: String,
    /// The earlier operation.
    pub first: OpRef,
    /// The later operation, which is not ordered after `first`.
    pub second: OpRef,
}

impl fmt::Display for Hazard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            HazardKind::UnorderedRead => "reads, not ordered after the write by",
            HazardKind::WriteRace => "writes, racing the earlier access by",
            HazardKind::ReleaseRace => "releases it while it may still be in use by",
            HazardKind::UseAfterRelease => "accesses it after its release by",
        };
        write!(f, "{:?} on `{}`: {} {what} {}", self.kind, self.buffer, self.second, self.first)
    }
}
