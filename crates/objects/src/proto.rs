//! The sans-IO object protocol: hybrid clocks, messages, conditional writes, anti-entropy, the HTTP headers the API parses, placement and merging of copies, quorum plans, and the topic envelope.

pub mod cas;
pub mod clock;
pub mod entropy;
pub mod headers;
pub mod object;
pub mod quorum;
pub mod stamps;
pub mod topic;
