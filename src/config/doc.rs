//! The checking of a TOML text: every error names the key and the line
//! it is on.

use std::ops::Range;
use std::time::Duration;

use poolgate_actors::core::{NodeId, PoolDefinition, PoolId};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::ConfigError;

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
    ) -> Result<PoolDefinition, ConfigError> {
        const KEY: &str = "pool.members";
        let DeValue::Array(items) = value.get_ref() else {
            return Err(self.error(value.span(), KEY, "must be a list of node ids"));
        };
        let mut members = Vec::with_capacity(items.len());
        let mut spans = Vec::with_capacity(items.len());
        for item in items.iter() {
            let (text, span) = self.string(item, KEY)?;
            members.push(NodeId::new(&text).map_err(|e| self.error(span.clone(), KEY, e))?);
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
            self.error(span, KEY, e)
        })
    }
}

pub(super) fn dotted(section: &str, key: &str) -> String {
    if section.is_empty() {
        key.to_string()
    } else {
        format!("{section}.{key}")
    }
}
