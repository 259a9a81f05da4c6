//! The sans-IO object protocol: hybrid clocks, messages, placement and merging of copies, and quorum plans.

pub mod clock;
pub mod object;
pub mod quorum;
