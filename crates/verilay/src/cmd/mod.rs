pub mod build;
pub mod extract;
pub mod fsck;
pub mod inspect;
