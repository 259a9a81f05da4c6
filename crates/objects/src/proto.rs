//! The sans-IO object protocol: hybrid clocks, messages, conditional writes, anti-entropy, placement and merging of copies, quorum plans, and the topic envelope.

pub mod cas;
pub mod clock;
pub mod entropy;
pub mod object;
pub mod quorum;
pub mod topic;
