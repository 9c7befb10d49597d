//! A bank account service: one aggregate (`account`) and one view (`accounts`).

pub mod account;
pub mod view;
