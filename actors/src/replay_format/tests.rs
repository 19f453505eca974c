//! The replay format's unit tests: each record type written and read
//! both ways, the one table's checks, and the errors that name a field.

use super::*;
use poolgate_core::SwimState;

#[test]
fn a_records_type_is_told_however_it_is_spelled_and_only_its_own() {
    for (text, kind, is) in [
        (
            r#"{"at_ms":1,"type":"remove_pool","pool":"a"}"#,
            "remove_pool",
            true,
        ),
        // Escaped, its type spells `remove_pool` all the same.
        (
            r#"{"at_ms":1,"type":"remove\u005fpool","pool":"a"}"#,
            "remove_pool",
            true,
        ),
        (
            r#"{"at_ms":1,"type":"\u0072emove_pool","pool":"a"}"#,
            "remove_pool",
            true,
        ),
        (
            r#"{"at_ms":0,"type":"s\u0065ttings","window_ms":5}"#,
            "settings",
            true,
        ),
        // Another type, or the word in another field.
        (
            r#"{"at_ms":1,"type":"swim","node":"n","state":"alive","incarnation":1}"#,
            "remove_pool",
            false,
        ),
        (
            r#"{"at_ms":1,"type":"available","node":"remove_pool"}"#,
            "remove_pool",
            false,
        ),
        (
            r#"{"at_ms":1,"type":"avail\u0061ble","node":"n"}"#,
            "remove_pool",
            false,
        ),
    ] {
        assert_eq!(is_of_type(text, kind), is, "{text}");
        assert_eq!(object_of_type(text, kind).is_some(), is, "{text}");
    }
    assert_eq!(
        read_removal(r#"{"at_ms":7,"type":"remove\u005fpool","pool":"a"}"#),
        Ok(Some((7, PoolId::new("a").unwrap())))
    );
}

/// One record of every type, as the recording or a scenario has it.
fn one_of_each() -> Vec<Line<'static>> {
    let o = |s: &'static str| Cow::Borrowed(s);
    vec![
        Line::settings(
            Duration::from_secs(5),
            PlanningPolicy {
                on_readiness_lost: OnReadinessLost::Abort,
                wait_timeout: None,
            },
            None,
        ),
        Line::Restored {
            pool: None,
            durable: Cow::Owned(Durable::default()),
            restore_grace_ms: 30_000,
        },
        Line::DefinePool {
            pool: o("pool-a"),
            members: vec![o("node-1"), o("node-2")],
        },
        Line::RemovePool { pool: o("pool-a") },
        Line::Known { node: o("node-1") },
        Line::Forgotten { node: o("node-1") },
        Line::Swim {
            node: o("node-1"),
            state: SwimStateName(SwimState::Suspect),
            incarnation: 3,
        },
        Line::Available { node: o("node-1") },
        Line::Unavailable { node: o("node-1") },
        Line::Identity {
            node: o("node-1"),
            material: Some(o("a2V5")),
            fingerprint: None,
        },
        Line::Faulted {
            node: o("node-1"),
            reason: o("disk \"full\""),
        },
        Line::Recovered { node: o("node-1") },
        Line::BeginPlanning {
            pool: Some(o("pool-a")),
            run: o("run-1"),
            epoch: Some(2),
        },
        Line::CommitPlan {
            pool: None,
            run: o("run-1"),
            required: vec![o("node-1")],
            epoch: None,
        },
        Line::FinishRun {
            pool: Some(o("pool-a")),
            run: o("run-1"),
        },
        Line::AbortPlanning {
            pool: None,
            run: o("run-2"),
        },
    ]
}

#[test]
fn every_type_is_written_as_it_is_read_both_ways_and_listed_once() {
    let mut seen = Vec::new();
    for line in one_of_each() {
        let text = write(7, &line);
        assert!(text.starts_with(r#"{"at_ms":7,"type":""#), "{text}");
        let object: Value = serde_json::from_str(&text).unwrap();
        let kind = object["type"].as_str().unwrap().to_string();
        assert_eq!(type_spelled(&text), Some(kind.as_str()), "{text}");
        assert!(read_whole(&kind, &text).is_some(), "one pass: {text}");
        let (at_ms, back) = read(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!((at_ms, &back), (7, &line), "{text}");
        assert_eq!(read_slowly(&text), Ok((7, line)), "{text}");
        let (_, fields) = FIELDS.iter().find(|(k, _)| *k == kind).unwrap();
        for name in object.as_object().unwrap().keys() {
            assert!(
                ["at_ms", "type"].contains(&name.as_str()) || fields.iter().any(|(f, _)| f == name),
                "FIELDS says what `{name}` holds ({text})"
            );
        }
        seen.push(kind);
    }
    assert_eq!(seen, TYPES, "TYPES lists every record type, in order");
}

#[test]
fn a_field_of_one_name_holds_the_same_in_every_type() {
    for (kind, fields) in FIELDS {
        for (name, holds) in *fields {
            for (other, theirs) in FIELDS {
                if let Some((_, their)) = theirs.iter().find(|(f, _)| f == name) {
                    assert_eq!(holds, their, "`{name}` of {kind} and of {other}");
                }
            }
        }
    }
}

#[test]
fn a_type_spelled_plainly_is_guessed_and_checked_when_read() {
    let swim = r#"{"at_ms":1,"type":"swim","node":"n","state":"alive","incarnation":1}"#;
    assert_eq!(type_spelled(swim), Some("swim"));
    let spaced = r#"{ "at_ms" : 1 , "type" : "known" , "node" : "n" }"#;
    assert_eq!(type_spelled(spaced), Some("known"));
    assert_eq!(read(spaced), read_slowly(spaced));
    // Escaped: no guess, the slow way reads it.
    let escaped = r#"{"at_ms":1,"type":"kn\u006fwn","node":"n"}"#;
    assert_eq!(type_spelled(escaped), None);
    assert!(read(escaped).is_ok());
    // A guess the record belies: the slow way, and its error.
    let twice = r#"{"at_ms":1,"type":"known","type":"swim","node":"n"}"#;
    assert_eq!(read(twice), read_slowly(twice));
    assert!(read_whole("known", r#"{"at_ms":1,"type":"swim","node":"n"}"#).is_none());
    // A mistyped field of the record's type is named; a field of
    // another type's is not the record's, and is ignored as any other.
    let e = read(r#"{"at_ms":1,"type":"known","node":5}"#).unwrap_err();
    assert_eq!(e, "field `node` must be a string, not 5");
    let ok = read(r#"{"at_ms":1,"type":"known","node":"n","members":5}"#);
    assert_eq!(
        ok.map(|(_, line)| line),
        Ok(Line::Known {
            node: Cow::Borrowed("n")
        })
    );
}

#[test]
fn a_mistyped_field_and_an_unknown_type_are_named() {
    let e = read(r#"{"at_ms":1,"type":"swim","node":"n","state":"alive","incarnation":"1"}"#)
        .unwrap_err();
    assert_eq!(
        e,
        r#"field `incarnation` must be a whole number ≥ 0, not "1""#
    );
    let e = read(r#"{"at_ms":1,"type":"reboot"}"#).unwrap_err();
    assert_eq!(e, "unknown record type `reboot`");
    let e = read(r#"{"at_ms":1,"type":"swim","node":"n","state":"zombie","incarnation":1}"#)
        .unwrap_err();
    assert!(e.contains("unknown SWIM state `zombie`"), "{e}");
    let restored = |rest: &str| read_restored(&format!(r#"{{"at_ms":0,"type":"restored"{rest}}}"#));
    assert_eq!(restored("").unwrap_err(), "missing field `durable`");
    let e = restored(r#","durable":{"last_epoch":"x","run":null},"restore_grace_ms":5"#);
    assert_eq!(e.unwrap_err(), "field `durable` is not a restored state");
    let e = restored(r#","durable":{"last_epoch":1,"run":null}"#);
    assert_eq!(
        e.unwrap_err(),
        "field `restore_grace_ms` must be a whole number ≥ 0"
    );
    let e = restored(
        r#","durable":{"last_epoch":1,"run":null},"restore_grace_ms":18446744073709551615"#,
    );
    assert!(
        e.unwrap_err().contains("365 days"),
        "no timer waits that long"
    );
    let ok = restored(r#","durable":{"last_epoch":1,"run":null},"restore_grace_ms":5,"node":1"#);
    assert_eq!(
        ok.unwrap().map(|r| (r.durable.last_epoch, r.grace)),
        Some((1, Duration::from_millis(5)))
    );
    // An ordinary record's error is not hidden by a restored-only field.
    let e = read(r#"{"at_ms":1,"type":"known","restore_grace_ms":"x"}"#).unwrap_err();
    assert_eq!(e, "missing field `node`");
    // A recording's first line: its `at_ms` is not read.
    let settings = read_settings(
        r#"{"type":"settings","window_ms":5000,"on_readiness_lost":"wait","wait_timeout_ms":null}"#,
    );
    assert_eq!(
        settings.unwrap().map(|s| s.window),
        Some(Duration::from_secs(5))
    );
}

#[test]
fn the_recorded_identity_is_the_fingerprint_never_the_bytes() {
    let material = IdentityMaterial::new(b"secret bytes".to_vec()).unwrap();
    let observation = Observation::Identity(material.fingerprint());
    let text = write(1, &Line::observation("node-1", &observation));
    assert!(!text.contains("c2VjcmV0"), "{text}");
    let (_, line) = read(&text).unwrap();
    let input = line.into_input().unwrap().unwrap();
    let Input::Observation {
        node,
        observation: back,
    } = input
    else {
        panic!("an observation, not {input:?}");
    };
    assert_eq!((node.as_str(), back), ("node-1", observation));
}
