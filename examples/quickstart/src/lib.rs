//! A bank account service, the smallest complete eventfold service: one aggregate
//! (`account`) and one view (`accounts`). docs/guide.md builds it from an empty crate.

pub mod account;
pub mod view;
