//! Holds what the observer knows about OpenIM itself, used by the engine and the offline tools
//! alike: the consistent-hash ring both routing components use (`hashring`), how each spells a
//! gateway and what separates two spellings (`members`), and the prose of every diagnosis
//! (`diagnosis`).

pub mod diagnosis;
pub mod hashring;
pub mod members;
