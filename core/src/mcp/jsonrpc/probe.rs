//! The members of `params` (and of `params._meta`) that the handlers read
//! on every request, declared once.
//!
//! A message is read one of three ways: by the plain-shape reader
//! ([`super::fast`]), by serde_json when that reader gives up, or from an
//! already decoded object ([`super::Incoming::from_value`]). All three
//! follow the tables below: a member is added by one line there, which
//! names it, the field that keeps it, and how it is kept (a
//! [`MemberReader`] method: each reader knows how to do each kind, the
//! tables say which kind each member is). A member given twice counts with
//! its last value, as in a [`Map`].

use std::convert::Infallible;
use std::marker::PhantomData;

use serde::de::{DeserializeSeed, MapAccess, Visitor};
use serde_json::{Map, Value};

use super::bounded::{self, Limited, Measure};
use super::{
    MAX_INITIALIZE_FIELD_BYTES, META_CLIENT_CAPABILITIES, META_PROTOCOL_VERSION, Params,
    ParamsValue,
};

/// `params.arguments` as kept.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Arguments {
    /// The arguments (with the run's `arguments` inside replaced by an
    /// empty object when they are too large to keep).
    pub(super) value: Value,
    /// The size of the run's `arguments` when an empty object stands for
    /// them.
    pub(super) too_large: Option<usize>,
}

/// What `params._meta` is, when present, with the members the server reads.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::mcp) enum MetaProbe {
    /// `_meta` is not an object.
    NotObject,
    /// `_meta` is an object with these members.
    Object(MetaMembers),
}

/// How one reader reads the value of a member the handlers read. Every
/// kind reads the value as a [`Value`] would be read (the same refusals)
/// and keeps it only as far as the handlers read it ([`bounded`]).
pub(super) trait MemberReader: Sized {
    /// Why the value could not be read.
    type Error;
    /// A value kept whole when it is short ([`bounded::scalar`]).
    fn scalar(self) -> Result<Value, Self::Error>;
    /// A tool's arguments ([`bounded::tool_arguments`]).
    fn arguments(self) -> Result<Arguments, Self::Error>;
    /// A member bounded by [`MAX_INITIALIZE_FIELD_BYTES`].
    fn sized(self) -> Result<Limited, Self::Error>;
    /// Client capabilities ([`bounded::capabilities`]).
    fn capabilities(self) -> Result<Value, Self::Error>;
    /// `subscriptions/listen`'s notifications ([`bounded::notifications`]).
    fn notifications(self) -> Result<Value, Self::Error>;
    /// `params._meta`.
    fn meta(self) -> Result<MetaProbe, Self::Error>;
}

/// The members of an object that the handlers read, as one table.
pub(super) trait Probed: Default {
    /// A member of the table.
    type Member: Copy + 'static;
    /// Every member the handlers read, by name.
    const MEMBERS: &[(&str, Self::Member)];

    /// Keeps `member`'s value, read by `reader`.
    fn keep<R: MemberReader>(&mut self, member: Self::Member, reader: R) -> Result<(), R::Error>;

    /// The member named `name`, when the handlers read it.
    fn member(name: &[u8]) -> Option<Self::Member> {
        Self::MEMBERS
            .iter()
            .find(|(known, _)| known.as_bytes() == name)
            .map(|&(_, member)| member)
    }

    /// The members of a decoded object.
    fn of_map(map: &Map<String, Value>) -> Self {
        let mut probe = Self::default();
        for &(name, member) in Self::MEMBERS {
            if let Some(value) = map.get(name) {
                let Ok(()) = probe.keep(member, value);
            }
        }
        probe
    }
}

/// Declares the members of an object the handlers read: a struct with an
/// `Option` for each (its last occurrence), the names as one table, and
/// [`MemberReader`]-driven reading.
macro_rules! probed_members {
    (
        $(#[$doc:meta])*
        $probe:ident, by $member:ident {
            $($(#[$field_doc:meta])* [$name:expr] => $field:ident: $ty:ty = $how:ident,)*
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone, Default, Debug, PartialEq)]
        pub(in crate::mcp) struct $probe {
            $($(#[$field_doc])* pub(in crate::mcp) $field: Option<$ty>,)*
        }

        /// A member of the table, by the field that keeps it.
        #[derive(Clone, Copy, Debug)]
        #[allow(non_camel_case_types)]
        pub(super) enum $member {
            $($field,)*
        }

        impl Probed for $probe {
            type Member = $member;
            const MEMBERS: &[(&str, $member)] = &[$(($name, $member::$field),)*];

            fn keep<R: MemberReader>(
                &mut self,
                member: $member,
                reader: R,
            ) -> Result<(), R::Error> {
                match member {
                    $($member::$field => self.$field = Some(reader.$how()?),)*
                }
                Ok(())
            }
        }
    };
}

probed_members! {
    /// The members of `params` the handlers read.
    Probe, by ParamsMember {
        /// `tools/call`'s and `prompts/get`'s `name`.
        ["name"] => name: Value = scalar,
        /// `resources/read`'s `uri`.
        ["uri"] => uri: Value = scalar,
        /// The tasks extension's `taskId`.
        ["taskId"] => task_id: Value = scalar,
        /// `tools/call`'s `arguments`.
        ["arguments"] => arguments: Arguments = arguments,
        /// The request's `_meta`.
        ["_meta"] => meta: MetaProbe = meta,
        /// `initialize`'s `protocolVersion`.
        ["protocolVersion"] => protocol_version: Value = scalar,
        /// `initialize`'s `clientInfo`.
        ["clientInfo"] => client_info: Limited = sized,
        /// `initialize`'s `capabilities`.
        ["capabilities"] => capabilities: Limited = sized,
        /// `subscriptions/listen`'s `notifications`.
        ["notifications"] => notifications: Value = notifications,
    }
}

probed_members! {
    /// The members of `params._meta` the handlers read.
    MetaMembers, by MetaMember {
        /// The protocol version of a 2026-07-28 request.
        [META_PROTOCOL_VERSION] => protocol_version: Value = scalar,
        /// The client's capabilities in a 2026-07-28 request.
        [META_CLIENT_CAPABILITIES] => client_capabilities: Value = capabilities,
        /// The token of progress notifications.
        ["progressToken"] => progress_token: Value = scalar,
    }
}

/// A decoded object's member: kept whole (it is already built).
impl MemberReader for &Value {
    type Error = Infallible;
    fn scalar(self) -> Result<Value, Infallible> {
        Ok(self.clone())
    }
    fn arguments(self) -> Result<Arguments, Infallible> {
        Ok(Arguments {
            value: self.clone(),
            too_large: None,
        })
    }
    fn sized(self) -> Result<Limited, Infallible> {
        Ok(Limited::of(self, MAX_INITIALIZE_FIELD_BYTES))
    }
    fn capabilities(self) -> Result<Value, Infallible> {
        Ok(self.clone())
    }
    fn notifications(self) -> Result<Value, Infallible> {
        Ok(self.clone())
    }
    fn meta(self) -> Result<MetaProbe, Infallible> {
        Ok(match self {
            Value::Object(meta) => MetaProbe::Object(MetaMembers::of_map(meta)),
            _ => MetaProbe::NotObject,
        })
    }
}

/// The next value of a map serde_json reads.
pub(super) struct SerdeMember<'m, 'de, A>(&'m mut A, PhantomData<&'de ()>);

impl<'de, A: MapAccess<'de>> SerdeMember<'_, 'de, A> {
    fn bounded<T>(
        self,
        read: impl FnOnce(&serde_json::value::RawValue) -> Result<T, serde_json::Error>,
    ) -> Result<T, A::Error> {
        let raw: &'de serde_json::value::RawValue = self.0.next_value()?;
        read(raw).map_err(<A::Error as serde::de::Error>::custom)
    }
}

impl<'de, A: MapAccess<'de>> MemberReader for SerdeMember<'_, 'de, A> {
    type Error = A::Error;
    fn scalar(self) -> Result<Value, A::Error> {
        self.bounded(bounded::scalar)
    }
    fn arguments(self) -> Result<Arguments, A::Error> {
        self.bounded(bounded::tool_arguments)
            .map(|(value, too_large)| Arguments { value, too_large })
    }
    fn sized(self) -> Result<Limited, A::Error> {
        self.bounded(|raw| Limited::read(raw, MAX_INITIALIZE_FIELD_BYTES))
    }
    fn capabilities(self) -> Result<Value, A::Error> {
        self.bounded(bounded::capabilities)
    }
    fn notifications(self) -> Result<Value, A::Error> {
        self.bounded(bounded::notifications)
    }
    fn meta(self) -> Result<MetaProbe, A::Error> {
        self.0.next_value()
    }
}

/// Reads the members of the object `map` serde_json is reading into
/// `probe`: the listed ones as the table says, every other one measured
/// and dropped (so exactly the messages a [`Value`] accepts are accepted).
fn read_members<'de, A: MapAccess<'de>, P: Probed>(
    mut map: A,
    probe: &mut P,
) -> Result<(), A::Error> {
    while let Some(name) = map.next_key_seed(NameOf::<P>(PhantomData))? {
        match name {
            Some(member) => probe.keep(member, SerdeMember(&mut map, PhantomData))?,
            None => {
                map.next_value::<Measure>()?;
            }
        }
    }
    Ok(())
}

/// Reads a member name as a member of `P`'s table, without allocating.
struct NameOf<P>(PhantomData<P>);

impl<'de, P: Probed> DeserializeSeed<'de> for NameOf<P> {
    type Value = Option<P::Member>;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Option<P::Member>, D::Error> {
        deserializer.deserialize_identifier(self)
    }
}

impl<P: Probed> Visitor<'_> for NameOf<P> {
    type Value = Option<P::Member>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a member name")
    }
    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Option<P::Member>, E> {
        Ok(P::member(name.as_bytes()))
    }
}

/// Consumes the elements of an array, each read as a [`Value`] would be
/// (so that exactly what the general parse accepts is accepted), without
/// building them.
fn skip_elements<'de, A: serde::de::SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<Measure>()?.is_some() {}
    Ok(())
}

/// Implements the scalar visits of a visitor whose value for any
/// non-object, non-null JSON value is `$other` (and for `null`, `$null`).
macro_rules! not_an_object {
    ($other:expr, $null:expr) => {
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($null)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            skip_elements(seq)?;
            Ok($other)
        }
    };
}

impl<'de> serde::Deserialize<'de> for ParamsValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = ParamsValue;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the params of a JSON-RPC message")
            }
            not_an_object!(ParamsValue::Other, ParamsValue::Null);
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ParamsValue, A::Error> {
                let mut probe = Probe::default();
                read_members(map, &mut probe)?;
                Ok(ParamsValue::Object(Params {
                    probe,
                    ..Params::default()
                }))
            }
        }
        deserializer.deserialize_any(Members)
    }
}

impl<'de> serde::Deserialize<'de> for MetaProbe {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = MetaProbe;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the _meta of a JSON-RPC message")
            }
            not_an_object!(MetaProbe::NotObject, MetaProbe::NotObject);
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<MetaProbe, A::Error> {
                let mut members = MetaMembers::default();
                read_members(map, &mut members)?;
                Ok(MetaProbe::Object(members))
            }
        }
        deserializer.deserialize_any(Members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_member_is_found_by_its_name_and_no_other() {
        for &(name, member) in Probe::MEMBERS {
            assert!(
                matches!(Probe::member(name.as_bytes()), Some(m) if std::mem::discriminant(&m) == std::mem::discriminant(&member))
            );
        }
        for &(name, member) in MetaMembers::MEMBERS {
            assert!(
                matches!(MetaMembers::member(name.as_bytes()), Some(m) if std::mem::discriminant(&m) == std::mem::discriminant(&member))
            );
        }
        assert!(Probe::member(b"Name").is_none());
        assert!(Probe::member(b"progressToken").is_none());
        assert!(MetaMembers::member(b"name").is_none());
    }
}
