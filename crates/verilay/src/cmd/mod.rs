pub mod build;
pub mod cat;
pub mod digest;
pub mod extract;
pub mod fsck;
mod image;
pub mod inspect;
pub mod mount;
pub mod verify;
