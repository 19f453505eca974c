//! The checking of a TOML text: every error names the key and the line
//! it is on.

use std::ops::Range;
use std::time::Duration;

use poolgate_actors::core::{NodeId, OnReadinessLost, PlanningPolicy, PoolDefinition, PoolId};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::{in_words, ConfigError, PoolConfig};

pub(super) type Table<'i> = DeTable<'i>;
pub(super) type Value<'i> = Spanned<DeValue<'i>>;

/// The text being checked, for turning spans into lines.
pub(super) struct Doc<'a> {
    pub(super) text: &'a str,
    pub(super) file: &'a str,
}

impl<'a> Doc<'a> {
    pub(super) fn error(
        &self,
        span: Range<usize>,
        key: &str,
        message: impl ToString,
    ) -> ConfigError {
        let end = span.start.min(self.text.len());
        ConfigError::Invalid {
            file: self.file.to_string(),
            line: self.text.as_bytes()[..end]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1,
            key: key.to_string(),
            message: message.to_string(),
        }
    }

    pub(super) fn only_keys(
        &self,
        table: &Table<'_>,
        section: &str,
        allowed: &[&str],
    ) -> Result<(), ConfigError> {
        for (key, _) in table.iter() {
            if !allowed.contains(&key.get_ref().as_ref()) {
                let dotted = dotted(section, key.get_ref());
                let expected = allowed.join("`, `");
                return Err(self.error(
                    key.span(),
                    &dotted,
                    format!("unknown key (expected `{expected}`)"),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn section<'t, 'i>(
        &self,
        root: &'t Table<'i>,
        name: &str,
    ) -> Result<Option<(&'t Table<'i>, Range<usize>)>, ConfigError> {
        match root.get(name) {
            Some(value) => match value.get_ref() {
                DeValue::Table(table) => Ok(Some((table, value.span()))),
                _ => Err(self.error(value.span(), name, "must be a table")),
            },
            None => Ok(None),
        }
    }

    /// As `section`, for a section that must be there (`node.toml`'s).
    #[cfg(feature = "live")]
    pub(super) fn required_section<'t, 'i>(
        &self,
        root: &'t Table<'i>,
        name: &str,
    ) -> Result<(&'t Table<'i>, Range<usize>), ConfigError> {
        self.section(root, name)?
            .ok_or_else(|| self.error(0..0, name, "missing section"))
    }

    pub(super) fn required<'t, 'i>(
        &self,
        table: &'t Table<'i>,
        section: &str,
        key: &str,
        section_span: Range<usize>,
    ) -> Result<&'t Value<'i>, ConfigError> {
        table
            .get(key)
            .ok_or_else(|| self.error(section_span, &dotted(section, key), "missing key"))
    }

    /// A boolean.
    pub(super) fn boolean(&self, value: &Value<'_>, key: &str) -> Result<bool, ConfigError> {
        match value.get_ref() {
            DeValue::Boolean(b) => Ok(*b),
            _ => Err(self.error(value.span(), key, "must be true or false")),
        }
    }

    pub(super) fn string(
        &self,
        value: &Value<'_>,
        key: &str,
    ) -> Result<(String, Range<usize>), ConfigError> {
        match value.get_ref() {
            DeValue::String(s) => Ok((s.to_string(), value.span())),
            _ => Err(self.error(value.span(), key, "must be a string")),
        }
    }

    pub(super) fn duration(
        &self,
        value: &Value<'_>,
        key: &str,
    ) -> Result<(Duration, Range<usize>), ConfigError> {
        let (text, span) = self.string(value, key)?;
        let duration = humantime::parse_duration(&text).map_err(|e| {
            self.error(
                span.clone(),
                key,
                format!("`{text}` is not a duration ({e}); write e.g. \"5s\""),
            )
        })?;
        if let Some(problem) = poolgate_actors::duration_problem(duration) {
            return Err(self.error(span, key, format!("`{text}` {problem}")));
        }
        Ok((duration, span))
    }

    pub(super) fn strings(&self, value: &Value<'_>, key: &str) -> Result<Vec<String>, ConfigError> {
        let DeValue::Array(items) = value.get_ref() else {
            return Err(self.error(value.span(), key, "must be a list of strings"));
        };
        items
            .iter()
            .map(|item| self.string(item, key).map(|(text, _)| text))
            .collect()
    }

    pub(super) fn members(
        &self,
        value: &Value<'_>,
        id: PoolId,
        key: &str,
    ) -> Result<PoolDefinition, ConfigError> {
        let DeValue::Array(items) = value.get_ref() else {
            return Err(self.error(value.span(), key, "must be a list of node ids"));
        };
        let mut members = Vec::with_capacity(items.len());
        let mut spans = Vec::with_capacity(items.len());
        for item in items.iter() {
            let (text, span) = self.string(item, key)?;
            members.push(NodeId::new(&text).map_err(|e| self.error(span.clone(), key, e))?);
            spans.push(span);
        }
        PoolDefinition::new(id, members.clone()).map_err(|e| {
            use poolgate_actors::core::DefinitionError;
            let span = match &e {
                DefinitionError::NoMembers => value.span(),
                DefinitionError::DuplicateMember(node) => members
                    .iter()
                    .zip(&spans)
                    .filter(|(m, _)| *m == node)
                    .nth(1)
                    .map(|(_, s)| s.clone())
                    .unwrap_or_else(|| value.span()),
                _ => value.span(),
            };
            self.error(span, key, e)
        })
    }
}

impl Doc<'_> {
    /// `on_readiness_lost` and `wait_timeout` of `table` (`[planning]`, or
    /// a pool's), over `policy`; a wait timeout must be longer than
    /// `window` (when there is one to compare with).
    pub(super) fn planning(
        &self,
        table: &Table<'_>,
        section: &str,
        window: Option<Duration>,
        policy: &mut PlanningPolicy,
    ) -> Result<(), ConfigError> {
        if let Some(value) = table.get("on_readiness_lost") {
            let key = dotted(section, "on_readiness_lost");
            let (text, span) = self.string(value, &key)?;
            policy.on_readiness_lost =
                OnReadinessLost::from_name(&text).map_err(|e| self.error(span, &key, e))?;
        }
        if let Some(value) = table.get("wait_timeout") {
            let key = dotted(section, "wait_timeout");
            let (timeout, span) = self.duration(value, &key)?;
            if let Some(window) = window {
                self.wait_timeout_fits(timeout, window, span, &key)?;
            }
            policy.wait_timeout = Some(timeout);
        }
        Ok(())
    }

    fn wait_timeout_fits(
        &self,
        timeout: Duration,
        window: Duration,
        span: Range<usize>,
        key: &str,
    ) -> Result<(), ConfigError> {
        match poolgate_actors::wait_timeout_problem(timeout, window) {
            Some(problem) => Err(self.error(
                span,
                key,
                format!("{} {problem} ({})", in_words(timeout), in_words(window)),
            )),
            None => Ok(()),
        }
    }

    /// `[pools.<id>]`: each pool's members, window and policy, the window
    /// and policy defaulting to `window` and `policy`; by id.
    pub(super) fn pools(
        &self,
        table: &Table<'_>,
        window: Option<Duration>,
        policy: PlanningPolicy,
    ) -> Result<Vec<PoolConfig>, ConfigError> {
        let mut pools = Vec::new();
        for (key, value) in table.iter() {
            let section = dotted("pools", key.get_ref());
            let id = PoolId::new(key.get_ref()).map_err(|e| self.error(key.span(), &section, e))?;
            let DeValue::Table(pool) = value.get_ref() else {
                return Err(self.error(value.span(), &section, "must be a table"));
            };
            self.only_keys(
                pool,
                &section,
                &[
                    "members",
                    "convergence_window",
                    "on_readiness_lost",
                    "wait_timeout",
                ],
            )?;
            let members = self.required(pool, &section, "members", value.span())?;
            let definition = self.members(members, id, &dotted(&section, "members"))?;
            let convergence_window = match pool.get("convergence_window") {
                Some(value) => {
                    self.duration(value, &dotted(&section, "convergence_window"))?
                        .0
                }
                None => window.ok_or_else(|| {
                    self.error(
                        value.span(),
                        &dotted(&section, "convergence_window"),
                        "missing, and no [readiness] convergence_window to default to",
                    )
                })?,
            };
            let mut planning = policy;
            self.planning(pool, &section, Some(convergence_window), &mut planning)?;
            // A timeout from [planning] must fit this pool's own window.
            if let (Some(timeout), None) = (planning.wait_timeout, pool.get("wait_timeout")) {
                if let Some(problem) =
                    poolgate_actors::wait_timeout_problem(timeout, convergence_window)
                {
                    return Err(self.error(
                        value.span(),
                        &dotted(&section, "convergence_window"),
                        format!(
                            "{} is not shorter than [planning] wait_timeout {} ({problem})",
                            in_words(convergence_window),
                            in_words(timeout)
                        ),
                    ));
                }
            }
            pools.push(PoolConfig {
                definition,
                convergence_window,
                planning,
            });
        }
        pools.sort_by(|a, b| a.definition.id().cmp(b.definition.id()));
        Ok(pools)
    }
}

pub(super) fn dotted(section: &str, key: &str) -> String {
    if section.is_empty() {
        key.to_string()
    } else {
        format!("{section}.{key}")
    }
}
