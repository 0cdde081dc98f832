pub mod build;
pub mod extract;
pub mod fsck;
mod image;
pub mod inspect;
