//! [`rejections!`](crate::rejections!): an aggregate's rejection enum with its messages and
//! stable codes in one declaration, instead of a hand-written `Display` and
//! [`Reject::code`](crate::Reject::code).

/// Declares a rejection enum: each variant with its stable code (the `error` of the HTTP
/// 422 answer) and its message (a format string that may name the variant's fields).
/// Generates the enum, `Display`, `std::error::Error` and [`Reject`](crate::Reject).
///
/// ```
/// eventfold_core::rejections! {
///     /// Why an account refuses a command.
///     #[derive(Debug, Clone, PartialEq, Eq)]
///     pub enum Rejection {
///         /// `Open` of an account that is already open.
///         AlreadyOpen = "already_open" => "the account is already open",
///         /// `Withdraw` of more than the balance.
///         InsufficientFunds {
///             /// What the account holds.
///             balance_cents: u64,
///             /// What was asked for.
///             amount_cents: u64,
///         } = "insufficient_funds" => "cannot withdraw {amount_cents} cents, the balance is {balance_cents}",
///     }
/// }
///
/// use eventfold_core::Reject;
/// let r = Rejection::InsufficientFunds { balance_cents: 500, amount_cents: 800 };
/// assert_eq!(r.code(), "insufficient_funds");
/// assert_eq!(r.to_string(), "cannot withdraw 800 cents, the balance is 500");
/// assert_eq!(Rejection::AlreadyOpen.code(), "already_open");
/// ```
#[macro_export]
macro_rules! rejections {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident $({
                    $( $(#[$fmeta:meta])* $field:ident : $fty:ty ),* $(,)?
                })? = $code:literal => $message:literal
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $(
                $(#[$vmeta])*
                $variant $({ $( $(#[$fmeta])* $field : $fty ),* })?,
            )*
        }

        impl ::core::fmt::Display for $name {
            // A message need not name every field.
            #[allow(unused_variables)]
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                match self {
                    $( Self::$variant $({ $($field),* })? => ::core::write!(f, $message), )*
                }
            }
        }

        impl ::std::error::Error for $name {}

        impl $crate::Reject for $name {
            fn code(&self) -> &'static str {
                match self {
                    $( Self::$variant { .. } => $code, )*
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use crate::Reject;

    crate::rejections! {
        #[derive(Debug, Clone, PartialEq, Eq)]
        enum Refused {
            Unit = "unit" => "a unit variant",
            Named { a: u32, b: String } = "named" => "a={a} b={b}",
            Unused { a: u32 } = "unused" => "names no field",
        }
    }

    #[test]
    fn codes_and_messages_come_from_the_declaration() {
        assert_eq!(
            (Refused::Unit.code(), Refused::Unit.to_string()),
            ("unit", "a unit variant".to_owned())
        );
        let named = Refused::Named { a: 7, b: "x".into() };
        assert_eq!((named.code(), named.to_string()), ("named", "a=7 b=x".to_owned()));
        let unused = Refused::Unused { a: 1 };
        assert_eq!(
            (unused.code(), unused.to_string()),
            ("unused", "names no field".to_owned())
        );
        let _: &dyn std::error::Error = &unused;
    }
}
