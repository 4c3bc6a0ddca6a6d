//! `--daemon-cmd`: the daemon under test given as a command template, so another implementation
//! that speaks the wire can be qualified. The template is split like a shell word list (single
//! and double quotes group, no expansion) and each word's placeholders are filled:
//!
//! | placeholder | value |
//! | --- | --- |
//! | `{space}` | the space the case serves |
//! | `{server}` | the URL the daemon dials (a proxy's, when the case puts one in front) |
//! | `{root}` | the workspace root (holds `.cotal/`) |
//! | `{creds}` | a credential file the case hands the daemon instead of the workspace's |
//! | `{tls_ca}` | the broker's CA (PEM) on a TLS-required broker |
//!
//! Words between `[` and `]` (each bracket a word of its own) are kept only when every
//! placeholder in them has a value: `[ --tls --tls-ca {tls_ca} ]` vanishes on a plaintext broker,
//! `[ --creds {creds} ]` when the case uses the workspace's credential.
//!
//! `--host-cmd` is the same language for a standby host (the seeds' `cotal deliver --spaces
//! --root <dir> --server <url>` and the broker's TLS setting): `{root}` (required) is the host's
//! own root, prepared as an operator provisions one (a version-1 manifest naming the space, the
//! host's own scoped credentials under `.cotal/`); `{server}`, `{tls_ca}` and `{space}` (the
//! space its manifest names) as above; a host has no `{creds}` (its credentials are its root's).

use std::path::PathBuf;

use crate::rig::daemon::DaemonSpec;

use crate::kit::failure::Failure;

const PLACEHOLDERS: &[&str] = &["space", "server", "root", "creds", "tls_ca"];

/// A parsed template (of the daemon, and of its standby host when one was given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonCmd {
    text: String,
    words: Vec<Word>,
    /// `--host-cmd`: what starts a standby host of the same implementation.
    host: Option<Box<DaemonCmd>>,
}

/// Which flag a template comes from: what it must pass, and what it may not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flag {
    Daemon,
    Host,
}

impl Flag {
    fn name(self) -> &'static str {
        match self {
            Flag::Daemon => "--daemon-cmd",
            Flag::Host => "--host-cmd",
        }
    }

    fn required(self) -> &'static str {
        match self {
            Flag::Daemon => "space",
            Flag::Host => "root",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Word {
    Plain(String),
    Optional(Vec<String>),
}

/// What the placeholders stand for in one start.
#[derive(Debug, Clone)]
pub struct Values {
    pub space: String,
    pub server: String,
    pub root: PathBuf,
    pub creds: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub cwd: PathBuf,
}

impl Values {
    fn get(&self, name: &str) -> Option<String> {
        match name {
            "space" => Some(self.space.clone()),
            "server" => Some(self.server.clone()),
            "root" => Some(self.root.display().to_string()),
            "creds" => self.creds.as_ref().map(|p| p.display().to_string()),
            "tls_ca" => self.tls_ca.as_ref().map(|p| p.display().to_string()),
            _ => None,
        }
    }
}

/// Splits `text` into words: whitespace separates, quotes group.
fn split(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err("an unclosed quote".into());
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

fn placeholders(word: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut rest = word;
    while let Some(start) = rest.find('{') {
        let after = &rest[start + 1..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("{word:?}: `{{` without its `}}`"))?;
        let name = &after[..end];
        if !PLACEHOLDERS.contains(&name) {
            return Err(format!(
                "unknown placeholder {{{name}}} (placeholders: {})",
                PLACEHOLDERS
                    .iter()
                    .map(|p| format!("{{{p}}}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        out.push(name.to_string());
        rest = &after[end + 1..];
    }
    Ok(out)
}

fn fill(word: &str, values: &Values) -> Option<String> {
    let mut out = word.to_string();
    for name in placeholders(word).ok()? {
        let v = values.get(&name)?;
        out = out.replace(&format!("{{{name}}}"), &v);
    }
    Some(out)
}

impl DaemonCmd {
    /// Parses a `--daemon-cmd` template, refusing unknown placeholders, unbalanced brackets, an
    /// empty one and one without `{space}`.
    pub fn parse(text: &str) -> Result<DaemonCmd, String> {
        Self::parse_as(text, Flag::Daemon)
    }

    /// Parses a `--host-cmd` template (a standby host): as [`DaemonCmd::parse`], with `{root}`
    /// required and `{creds}` refused.
    pub fn parse_host(text: &str) -> Result<DaemonCmd, String> {
        Self::parse_as(text, Flag::Host)
    }

    fn parse_as(text: &str, flag: Flag) -> Result<DaemonCmd, String> {
        let name = flag.name();
        let raw = split(text).map_err(|e| format!("{name}: {e}"))?;
        let mut words = Vec::new();
        let mut group: Option<Vec<String>> = None;
        for w in raw {
            let used = placeholders(&w).map_err(|e| format!("{name}: {e}"))?;
            if flag == Flag::Host && used.iter().any(|p| p == "creds") {
                return Err(format!(
                    "{name}: a host has no {{creds}}: its credentials are its root's"
                ));
            }
            match (w.as_str(), &mut group) {
                ("[", None) => group = Some(Vec::new()),
                ("[", Some(_)) => return Err(format!("{name}: `[` inside `[ … ]`")),
                ("]", Some(g)) => {
                    words.push(Word::Optional(std::mem::take(g)));
                    group = None;
                }
                ("]", None) => return Err(format!("{name}: `]` without its `[`")),
                (_, Some(g)) => g.push(w),
                (_, None) => words.push(Word::Plain(w)),
            }
        }
        if group.is_some() {
            return Err(format!("{name}: `[` without its `]`"));
        }
        match words.first() {
            Some(Word::Plain(_)) => {}
            _ => {
                return Err(format!(
                    "{name}: the template starts with the program to run"
                ))
            }
        }
        let required = format!("{{{}}}", flag.required());
        if !words.iter().any(|w| match w {
            Word::Plain(p) => p.contains(&required),
            Word::Optional(_) => false,
        }) {
            return Err(format!("{name}: the template must pass {required}"));
        }
        Ok(DaemonCmd {
            text: text.to_string(),
            words,
            host: None,
        })
    }

    /// This daemon's template with `host` (a [`DaemonCmd::parse_host`]) as its standby host's.
    pub fn with_host(mut self, host: DaemonCmd) -> DaemonCmd {
        self.host = Some(Box::new(host));
        self
    }

    /// The template that starts a standby host, when `--host-cmd` gave one.
    pub fn host(&self) -> Option<&DaemonCmd> {
        self.host.as_deref()
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the template can hand the daemon a credential file of the case's choosing.
    pub fn takes_creds(&self) -> bool {
        self.words.iter().any(|w| match w {
            Word::Plain(p) => p.contains("{creds}"),
            Word::Optional(g) => g.iter().any(|p| p.contains("{creds}")),
        })
    }

    /// The argv for `values`.
    pub fn argv(&self, values: &Values) -> Result<Vec<String>, Failure> {
        let mut out = Vec::new();
        for w in &self.words {
            match w {
                Word::Plain(p) => out.push(fill(p, values).ok_or_else(|| {
                    Failure::could_not(format!(
                        "--daemon-cmd word {p:?} names a placeholder this start has no value for (put it inside [ … ])"
                    ))
                })?),
                Word::Optional(g) => {
                    let filled: Option<Vec<String>> = g.iter().map(|p| fill(p, values)).collect();
                    if let Some(words) = filled {
                        out.extend(words);
                    }
                }
            }
        }
        Ok(out)
    }

    /// The process spec for `values`.
    pub fn spec(&self, values: &Values) -> Result<DaemonSpec, Failure> {
        let argv = self.argv(values)?;
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| Failure::could_not("--daemon-cmd is empty"))?;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Ok(DaemonSpec::command(&args, &values.cwd).bin(PathBuf::from(program)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(tls: bool, creds: bool) -> Values {
        Values {
            space: "demo".into(),
            server: "nats://127.0.0.1:4222".into(),
            root: PathBuf::from("/ws"),
            creds: creds.then(|| PathBuf::from("/ws/x.creds")),
            tls_ca: tls.then(|| PathBuf::from("/pki/ca.pem")),
            cwd: PathBuf::from("/ws"),
        }
    }

    /// Mutation seen failing: an optional group kept when one of its placeholders is unset
    /// (`--tls-ca` with nothing after it reaches the daemon).
    #[test]
    fn optional_groups_vanish_without_their_values() {
        let cmd = DaemonCmd::parse(
            "node 'my daemon.js' --space {space} --server={server} [ --tls --tls-ca {tls_ca} ] [ --creds {creds} ]",
        )
        .unwrap();
        assert_eq!(
            cmd.argv(&values(false, false)).unwrap(),
            [
                "node",
                "my daemon.js",
                "--space",
                "demo",
                "--server=nats://127.0.0.1:4222"
            ]
        );
        assert_eq!(
            cmd.argv(&values(true, true)).unwrap()[5..],
            ["--tls", "--tls-ca", "/pki/ca.pem", "--creds", "/ws/x.creds"]
        );
        assert!(cmd.takes_creds());
    }

    /// A host template is filled like the daemon's, `{root}` being the host's root; it rides on
    /// the daemon's template.
    /// Mutation seen failing: `parse_host` requiring `{space}` as `--daemon-cmd` does (the
    /// template below is refused).
    #[test]
    fn a_host_template_starts_a_host_on_its_root() {
        let host = DaemonCmd::parse_host(
            "d deliver --spaces --root {root} --server {server} [ --tls --tls-ca {tls_ca} ]",
        )
        .unwrap();
        let mut v = values(true, false);
        v.root = PathBuf::from("/hosts/a");
        assert_eq!(
            host.argv(&v).unwrap(),
            [
                "d",
                "deliver",
                "--spaces",
                "--root",
                "/hosts/a",
                "--server",
                "nats://127.0.0.1:4222",
                "--tls",
                "--tls-ca",
                "/pki/ca.pem"
            ]
        );
        let daemon = DaemonCmd::parse("d --space {space}").unwrap();
        assert!(daemon.host().is_none());
        let daemon = daemon.with_host(host.clone());
        assert_eq!(daemon.host(), Some(&host));
    }

    #[test]
    fn bad_templates_are_refused_with_the_reason() {
        for (text, why) in [
            ("", "starts with the program"),
            ("d --space {space} {nope}", "unknown placeholder {nope}"),
            ("d --space {space} [ --tls", "`[` without its `]`"),
            ("d --space {space} ]", "`]` without its `[`"),
            ("d --server {server}", "must pass {space}"),
            ("d 'open", "unclosed quote"),
        ] {
            let e = DaemonCmd::parse(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
        for (text, why) in [
            (
                "h --server {server}",
                "--host-cmd: the template must pass {root}",
            ),
            (
                "h --root {root} [ --creds {creds} ]",
                "a host has no {creds}",
            ),
            (
                "h --root {root} {nope}",
                "--host-cmd: unknown placeholder {nope}",
            ),
        ] {
            let e = DaemonCmd::parse_host(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
        // A plain word naming a value the start lacks is refused at the start, not dropped.
        let cmd = DaemonCmd::parse("d --space {space} --creds {creds}").unwrap();
        assert!(cmd.argv(&values(false, false)).is_err());
    }
}
