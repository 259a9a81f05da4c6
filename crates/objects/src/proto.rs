//! The sans-IO object protocol: messages, placement and merging of copies, and quorum plans.

pub mod object;
pub mod quorum;
