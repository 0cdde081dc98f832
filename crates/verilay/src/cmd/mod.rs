pub mod build;
pub mod digest;
pub mod extract;
pub mod fsck;
mod image;
pub mod inspect;
