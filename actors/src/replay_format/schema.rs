//! The replay format's one table: every record type, as `type` spells it,
//! with its fields, their Rust types and what each holds. From it come
//! the [`Line`] enum (written and read through serde), [`TYPES`], the
//! field checks that name a mistyped value, and the fast path that reads
//! a well-formed line in one pass. A record type or field is added here,
//! and only here.

use std::borrow::Cow;

use poolgate_core::{Durable, SwimState};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Declares the records (see the module's documentation): each variant
/// `Name = "type" { field: Type as Holds, … }`, docs and serde attributes
/// on either.
macro_rules! records {
    ($(
        $(#[$meta:meta])*
        $variant:ident = $kind:literal {
            $(
                $(#[$field_meta:meta])*
                $field:ident : $ty:ty as $holds:ident,
            )*
        }
    )*) => {
        /// One record as it stands on a line, after its `at_ms`: borrowed
        /// when written, owned when read.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "type")]
        pub enum Line<'a> {
            $(
                $(#[$meta])*
                #[serde(rename = $kind)]
                $variant {
                    $(
                        $(#[$field_meta])*
                        $field: $ty,
                    )*
                },
            )*
        }

        /// Every record type, as `type` spells it.
        pub const TYPES: &[&str] = &[$($kind),*];

        /// Each record type's fields and what each holds.
        pub(super) const FIELDS: &[(&str, &[(&str, Holds)])] = &[
            $(($kind, &[$((stringify!($field), Holds::$holds)),*])),*
        ];

        /// Each record's fields on their own, with the line's `at_ms`
        /// and `type`: what a well-formed line is read into in one pass
        /// (`Line`, internally tagged, buffers the line first).
        mod whole {
            use super::*;

            $(
                #[derive(Deserialize)]
                #[allow(dead_code)]
                pub(super) struct $variant<'a> {
                    pub at_ms: u64,
                    #[serde(rename = "type")]
                    pub kind: Cow<'a, str>,
                    $(
                        $(#[$field_meta])*
                        pub $field: $ty,
                    )*
                }
            )*
        }

        /// The record `text` is, read in one pass, if it is of type
        /// `kind` and well formed; `None` sends it the slow way, which
        /// names what is wrong.
        pub(super) fn read_whole(kind: &str, text: &str) -> Option<(u64, Line<'static>)> {
            match kind {
                $(
                    $kind => {
                        let whole: whole::$variant<'static> = serde_json::from_str(text).ok()?;
                        if whole.kind != $kind {
                            return None;
                        }
                        Some((whole.at_ms, Line::$variant { $($field: whole.$field),* }))
                    }
                )*
                _ => None,
            }
        }
    };
}

records! {
    /// The gate's settings: a recording's first record. In a fleet's
    /// recording each pool's, naming it, before its first `define_pool`.
    Settings = "settings" {
        /// The pool they are for (a fleet's recording).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<Cow<'a, str>> as Text,
        /// The convergence window.
        window_ms: u64 as Count,
        /// `wait` or `abort`.
        on_readiness_lost: Cow<'a, str> as Text,
        /// How long a suspended planning waits; `null` = forever.
        #[serde(default)]
        wait_timeout_ms: Option<u64> as CountOrNull,
    }
    /// What a recording's gate restored, right after `settings`, once
    /// (in a fleet's recording, per pool, naming it).
    Restored = "restored" {
        /// The pool it is for (a fleet's recording).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<Cow<'a, str>> as Text,
        /// The restored state.
        durable: Cow<'a, Durable> as Restored,
        /// The restore grace.
        restore_grace_ms: u64 as Restored,
    }
    /// The candidate pool (re)defined.
    DefinePool = "define_pool" {
        /// The pool's id.
        pool: Cow<'a, str> as Text,
        /// Its members.
        members: Vec<Cow<'a, str>> as Ids,
    }
    /// A pool of a fleet removed (its run ended first): it gates nothing
    /// more.
    RemovePool = "remove_pool" {
        /// The pool's id.
        pool: Cow<'a, str> as Text,
    }
    /// The registry knows the node.
    Known = "known" {
        /// The node.
        node: Cow<'a, str> as Text,
    }
    /// The registry forgot the node.
    Forgotten = "forgotten" {
        /// The node.
        node: Cow<'a, str> as Text,
    }
    /// A SWIM fact.
    Swim = "swim" {
        /// The node.
        node: Cow<'a, str> as Text,
        /// Its SWIM state.
        state: SwimStateName as Text,
        /// At which incarnation.
        incarnation: u64 as Count,
    }
    /// The node's agent said `NodeAvailable`.
    Available = "available" {
        /// The node.
        node: Cow<'a, str> as Text,
    }
    /// The node's agent withdrew.
    Unavailable = "unavailable" {
        /// The node.
        node: Cow<'a, str> as Text,
    }
    /// The node's data-plane identity: the material (base64, scenarios)
    /// or its fingerprint (hex, recordings), not both.
    Identity = "identity" {
        /// The node.
        node: Cow<'a, str> as Text,
        /// The material, base64.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        material: Option<Cow<'a, str>> as Text,
        /// The fingerprint, hex.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fingerprint: Option<Cow<'a, str>> as Text,
    }
    /// The node's agent reported a fault.
    Faulted = "faulted" {
        /// The node.
        node: Cow<'a, str> as Text,
        /// Why.
        reason: Cow<'a, str> as Text,
    }
    /// The node's agent reported the fault cleared.
    Recovered = "recovered" {
        /// The node.
        node: Cow<'a, str> as Text,
    }
    /// Planning begins.
    BeginPlanning = "begin_planning" {
        /// The pool it is about (required when several are defined).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<Cow<'a, str>> as Text,
        /// The run.
        run: Cow<'a, str> as Text,
        /// The epoch the plan is made against.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epoch: Option<u64> as CountOrNull,
    }
    /// The plan is committed: provisioning begins.
    CommitPlan = "commit_plan" {
        /// The pool it is about (required when several are defined).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<Cow<'a, str>> as Text,
        /// The run.
        run: Cow<'a, str> as Text,
        /// Its required nodes.
        required: Vec<Cow<'a, str>> as Ids,
        /// The epoch the plan was made against.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epoch: Option<u64> as CountOrNull,
    }
    /// The run finished.
    FinishRun = "finish_run" {
        /// The pool it is about (required when several are defined).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<Cow<'a, str>> as Text,
        /// The run.
        run: Cow<'a, str> as Text,
    }
    /// The planning run was withdrawn (its requester is gone).
    AbortPlanning = "abort_planning" {
        /// The pool it is about (required when several are defined).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<Cow<'a, str>> as Text,
        /// The run.
        run: Cow<'a, str> as Text,
    }
}

/// A SWIM state as the format spells it (`alive`, `suspect`, `dead`,
/// `left`); any other word is named in the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwimStateName(pub SwimState);

impl Serialize for SwimStateName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.as_str())
    }
}

impl<'de> Deserialize<'de> for SwimStateName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Cow::<str>::deserialize(d)?;
        [
            SwimState::Alive,
            SwimState::Suspect,
            SwimState::Dead,
            SwimState::Left,
        ]
        .into_iter()
        .find(|state| state.as_str() == text)
        .map(SwimStateName)
        .ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown SWIM state `{text}` (expected alive, suspect, dead or left)"
            ))
        })
    }
}

/// What a field of a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holds {
    /// A string: an id, a name, base64 or hex.
    Text,
    /// A whole number ≥ 0.
    Count,
    /// A whole number ≥ 0, or `null` for none.
    CountOrNull,
    /// A list of ids.
    Ids,
    /// A `restored` record's own: read and checked by `read_restored`.
    Restored,
}

impl Holds {
    pub(super) fn fits(self, value: &Value) -> bool {
        match self {
            Holds::Text => value.is_string(),
            Holds::Count => value.is_u64(),
            Holds::CountOrNull => value.is_u64() || value.is_null(),
            Holds::Ids => value
                .as_array()
                .is_some_and(|items| items.iter().all(Value::is_string)),
            Holds::Restored => true,
        }
    }

    pub(super) fn expected(self) -> &'static str {
        match self {
            Holds::Text => "a string",
            Holds::Count | Holds::CountOrNull => "a whole number ≥ 0",
            Holds::Ids => "a list of ids",
            Holds::Restored => "what a `restored` record holds",
        }
    }
}
