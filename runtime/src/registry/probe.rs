//! What `handoff doctor` shows of an adapter's environment.

use std::fmt;

/// Whether a probed thing was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeStatus {
    /// Found and usable.
    Found,
    /// Looked for and not found (the detail says where and why).
    NotFound,
    /// Not looked for (the detail says why: an adapter not built, a feature off).
    NotChecked,
}

/// One line of `handoff doctor`: what was checked, whether it was found, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// What was checked (`libtorch`, `PJRT plugin /opt/...`, `CUDA device 0`).
    pub subject: String,
    /// Found or not.
    pub status: ProbeStatus,
    /// What was found (a version, a path) or why not.
    pub detail: String,
}

impl Probe {
    /// Something found.
    pub fn found(subject: impl Into<String>, detail: impl Into<String>) -> Probe {
        Probe { subject: subject.into(), status: ProbeStatus::Found, detail: detail.into() }
    }
    /// Something looked for and not found.
    pub fn not_found(subject: impl Into<String>, why: impl Into<String>) -> Probe {
        Probe { subject: subject.into(), status: ProbeStatus::NotFound, detail: why.into() }
    }
    /// Something not looked for.
    pub fn not_checked(subject: impl Into<String>, why: impl Into<String>) -> Probe {
        Probe { subject: subject.into(), status: ProbeStatus::NotChecked, detail: why.into() }
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match self.status {
            ProbeStatus::Found => "found",
            ProbeStatus::NotFound => "not found",
            ProbeStatus::NotChecked => "not checked yet",
        };
        write!(f, "{}: {status} ({})", self.subject, self.detail)
    }
}
