//! Calling the daemon's rails as their callers do, shared by every verb that sends a request:
//! the caller's connection (an agent on `ctl.delivery`, the supervisor on
//! `ctl.delivery-admin`), the `{op,args,from}` envelope with its placeholders expanded, one
//! request with its reply under the subject's own `.reply.` subtree, and the reply judged.

use std::time::{Duration, Instant};

use cotal_delivery::base::Credential;
use cotal_delivery::provision::{MintOptions, Profile};
use cotal_delivery::wire::{CtlService, Principal};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use super::verb::toml_to_json;
use crate::kit::failure::Failure;
use crate::kit::world::{AgentActor, World};

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Rail {
    Delivery,
    Admin,
}

impl Rail {
    pub fn service(self) -> CtlService {
        match self {
            Rail::Delivery => CtlService::Delivery,
            Rail::Admin => CtlService::DeliveryAdmin,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Rail::Delivery => "ctl.delivery",
            Rail::Admin => "ctl.delivery-admin",
        }
    }
}

/// `fill`: one argument set to a generated list of strings (appended to the argument's own
/// list when it has one).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fill {
    /// The argument the list goes in.
    pub key: String,
    /// Each item; `{i}` stands for its index.
    pub item: String,
    pub count: u64,
}

/// Longest list `fill` makes, and most rounds `repeat` sends.
pub const MAX_GENERATED: u64 = 10_000;

/// The admin rail's caller.
pub const SUPERVISOR: &str = "local.boss";

/// What a request to send is: the caller's connection, the rail subject, the body.
pub struct RailCall {
    pub client: async_nats::Client,
    pub subject: String,
    pub body: Vec<u8>,
    /// Who sends it and what, for the transcript.
    pub who: String,
    pub what: String,
}

/// The placeholders of `s`: each `{` name `}` whose name is word characters, dots, colons and
/// dashes, as (byte range of the whole, the name). JSON braces around a body never match: their
/// insides hold quotes.
pub fn placeholders(s: &str) -> Vec<(std::ops::Range<usize>, &str)> {
    let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-');
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(open) = s[from..].find('{').map(|i| from + i) {
        let inner_start = open + 1;
        let inner_len = s[inner_start..]
            .find(|c: char| !name_char(c))
            .unwrap_or(s.len() - inner_start);
        let close = inner_start + inner_len;
        if inner_len > 0 && s[close..].starts_with('}') {
            out.push((open..close + 1, &s[inner_start..close]));
            from = close + 1;
        } else {
            from = inner_start;
        }
    }
    out
}

/// The agents a value's strings name in `{<agent>.uid}` / `{<agent>.principal}`.
pub fn placeholder_agents(v: &toml::Value) -> Vec<String> {
    fn walk(v: &toml::Value, out: &mut Vec<String>) {
        match v {
            toml::Value::String(s) => {
                for (_, inner) in placeholders(s) {
                    if let Some((name, "uid" | "principal")) = inner.rsplit_once('.') {
                        out.push(name.to_string());
                    }
                }
            }
            toml::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            toml::Value::Table(t) => t.values().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, &mut out);
    out
}

/// Longest `{pad:N}`.
const MAX_PAD_BYTES: usize = 1 << 20;

/// `s` with `{i}` replaced by the round, `{<agent>.uid}` / `{<agent>.principal}` by that
/// agent's lifecycle uid or principal, `{pad:N}` by N `x` characters (a hostile length),
/// `{root}` by the workspace root and `{store.id}` by the id its filesystem store recorded in
/// `.cotal/store.id`. Anything else in braces is left as it is.
pub fn expand(w: &World, s: &str, round: Option<u64>) -> Result<String, Failure> {
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    for (whole, inner) in placeholders(s) {
        let value = if inner == "i" {
            round.map(|i| i.to_string())
        } else if let Some(n) = inner.strip_prefix("pad:") {
            let n: usize = n
                .parse()
                .map_err(|_| Failure::could_not(format!("{{{inner}}}: `pad:` takes a count")))?;
            if n > MAX_PAD_BYTES {
                return Err(Failure::could_not(format!(
                    "{{{inner}}}: at most {MAX_PAD_BYTES} characters"
                )));
            }
            Some("x".repeat(n))
        } else if inner == "root" {
            Some(w.mesh.root().display().to_string())
        } else if inner == "store.id" {
            // The random id the workspace's filesystem store records in `.cotal/store.id`.
            let path = w.mesh.root().join(".cotal/store.id");
            let id = std::fs::read_to_string(&path).map_err(|e| {
                Failure::could_not(format!("{{store.id}}: {}: {e}", path.display()))
            })?;
            Some(id.trim().to_string())
        } else {
            match inner.rsplit_once('.') {
                Some((name, "uid")) => Some(agent_of(w, name)?.material.lifecycle_uid.to_string()),
                Some((name, "principal")) => Some(agent_of(w, name)?.material.principal.dot_form()),
                _ => None,
            }
        };
        out.push_str(&s[last..whole.start]);
        match value {
            Some(v) => out.push_str(&v),
            None => out.push_str(&s[whole.clone()]),
        }
        last = whole.end;
    }
    out.push_str(&s[last..]);
    Ok(out)
}

pub fn agent_of<'a>(w: &'a World, name: &str) -> Result<&'a AgentActor, Failure> {
    w.agents
        .get(name)
        .ok_or_else(|| Failure::could_not(format!("no agent named {name:?}")))
}

/// A JSON value with every string expanded ([`expand`]).
pub fn expand_json(w: &World, v: &Value, round: Option<u64>) -> Result<Value, Failure> {
    Ok(match v {
        Value::String(s) => Value::String(expand(w, s, round)?),
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|x| expand_json(w, x, round))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| Ok((k.clone(), expand_json(w, x, round)?)))
                .collect::<Result<_, Failure>>()?,
        ),
        other => other.clone(),
    })
}

/// The request `caller` sends on `rail`: `op` with `args` (expanded, `fill` applied) in the
/// envelope, or the `raw` body.
#[allow(clippy::too_many_arguments)]
pub async fn call(
    w: &mut World,
    rail: Rail,
    caller: Option<&String>,
    op: Option<&String>,
    args: Option<&toml::Value>,
    raw: Option<&String>,
    fill: Option<&Fill>,
    round: Option<u64>,
) -> Result<RailCall, Failure> {
    if op.is_some() == raw.is_some() {
        return Err(Failure::could_not(
            "a request has `op` or `raw`, one of them",
        ));
    }
    let service = rail.service();
    let (client, principal) = match rail {
        Rail::Delivery => {
            let name = caller
                .ok_or_else(|| Failure::could_not("a `delivery` request names its agent (`as`)"))?;
            let a = w.agent(name)?;
            let c = a
                .client
                .as_ref()
                .ok_or_else(|| Failure::could_not(format!("agent {name} is offline")))?;
            (c.client().clone(), a.material.principal.clone())
        }
        Rail::Admin => {
            if caller.is_some() {
                return Err(Failure::could_not(
                    "the admin rail's caller is the supervisor",
                ));
            }
            (supervisor(w).await?, supervisor_principal()?)
        }
    };
    // How many items the filled argument holds in the end, for the transcript.
    let mut filled = 0;
    let body = match (op, raw) {
        (Some(op), _) => {
            let mut args = match args {
                Some(a) => expand_json(w, &toml_to_json(a), round)?,
                None => json!({}),
            };
            if let Some(f) = fill {
                if f.count > MAX_GENERATED {
                    return Err(Failure::could_not(format!(
                        "fill makes at most {MAX_GENERATED} items"
                    )));
                }
                let items = (0..f.count)
                    .map(|i| expand(w, &f.item, Some(i)).map(Value::String))
                    .collect::<Result<Vec<_>, _>>()?;
                match args.as_object_mut() {
                    Some(m) => match m.get_mut(&f.key) {
                        // The generated items follow the argument's own.
                        Some(Value::Array(own)) => {
                            own.extend(items);
                            filled = own.len();
                        }
                        _ => {
                            filled = items.len();
                            m.insert(f.key.clone(), Value::Array(items));
                        }
                    },
                    None => {
                        return Err(Failure::could_not("`fill` needs `args` to be a table"));
                    }
                }
            }
            json!({
                "op": op,
                "args": args,
                "from": {"id": principal.dot_form(), "name": "harness", "kind": "agent"},
            })
            .to_string()
            .into_bytes()
        }
        (None, Some(r)) => expand(w, r, round)?.into_bytes(),
        (None, None) => Vec::new(),
    };
    let what = match (op, fill) {
        (Some(op), Some(f)) => format!("{op} with {filled} {}", f.key),
        (Some(op), None) => op.clone(),
        (None, _) => "a raw body".into(),
    };
    Ok(RailCall {
        client,
        subject: w.insp.names.ctl_subject(service, &principal),
        body,
        who: caller.cloned().unwrap_or_else(|| "the supervisor".into()),
        what,
    })
}

/// What a reply is judged by, placeholders expanded ([`expand`]).
pub struct Expect {
    pub ok: Option<bool>,
    pub answer: Option<Value>,
    pub includes: Option<Value>,
    pub error: Option<String>,
}

impl Expect {
    pub fn new(
        w: &World,
        ok: &Option<bool>,
        answer: &Option<toml::Value>,
        includes: &Option<toml::Value>,
        error: &Option<String>,
    ) -> Result<Expect, Failure> {
        let json = |v: &Option<toml::Value>| {
            v.as_ref()
                .map(|v| expand_json(w, &toml_to_json(v), None))
                .transpose()
        };
        Ok(Expect {
            ok: *ok,
            answer: json(answer)?,
            includes: json(includes)?,
            error: error.as_ref().map(|e| expand(w, e, None)).transpose()?,
        })
    }
}

/// Judges a reply: [`check_reply`] and the `includes` fields.
pub fn check(reply: &Value, want: &Expect) -> Result<(), Failure> {
    let want_ok = want.ok.or(want.includes.as_ref().map(|_| true));
    check_reply(reply, want_ok, want.answer.clone(), want.error.as_deref())?;
    if let Some(want) = &want.includes {
        let want = want.clone();
        let data = reply.get("data").cloned().unwrap_or(Value::Null);
        if let Err(at) = contains(&data, &want, "data") {
            return Err(Failure::new(
                format!("the data to include {want} ({at} differs)"),
                data.to_string(),
            ));
        }
    }
    Ok(())
}

/// Whether `have` includes `want`: an object has each of `want`'s keys with an including
/// value, an array has as many elements as `want`'s, each including its match, anything else is
/// equal. `Err` names the first place that differs.
pub fn contains(have: &Value, want: &Value, at: &str) -> Result<(), String> {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => {
            for (k, wv) in w {
                let place = format!("{at}.{k}");
                match h.get(k) {
                    Some(hv) => contains(hv, wv, &place)?,
                    None => return Err(place),
                }
            }
            Ok(())
        }
        (Value::Array(h), Value::Array(w)) => {
            if h.len() != w.len() {
                return Err(format!("{at} (length {} against {})", h.len(), w.len()));
            }
            for (i, (hv, wv)) in h.iter().zip(w).enumerate() {
                contains(hv, wv, &format!("{at}[{i}]"))?;
            }
            Ok(())
        }
        (h, w) if h == w => Ok(()),
        _ => Err(at.to_string()),
    }
}

/// Judges a `{ok, data?, error?}` reply.
pub fn check_reply(
    reply: &Value,
    ok: Option<bool>,
    answer: Option<Value>,
    error: Option<&str>,
) -> Result<(), Failure> {
    let got_ok = reply.get("ok").and_then(Value::as_bool);
    let want_ok = match (ok, &answer, error) {
        (Some(o), _, _) => Some(o),
        (None, Some(_), _) => Some(true),
        (None, None, Some(_)) => Some(false),
        (None, None, None) => None,
    };
    if let Some(o) = want_ok {
        if got_ok != Some(o) {
            return Err(Failure::new(
                format!("a reply with ok:{o}"),
                reply.to_string(),
            ));
        }
    }
    if let Some(a) = answer {
        if reply.get("data") != Some(&a) {
            return Err(Failure::new(format!("the data {a}"), reply.to_string()));
        }
    }
    if let Some(e) = error {
        let text = reply
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !text.contains(e) {
            return Err(Failure::new(
                format!("an error containing {e:?}"),
                reply.to_string(),
            ));
        }
    }
    Ok(())
}

/// The supervisor's principal on the admin rail.
pub fn supervisor_principal() -> Result<Principal, Failure> {
    Principal::parse(SUPERVISOR).map_err(|e| Failure::could_not(e.to_string()))
}

/// The supervisor's connection (made once per run).
pub async fn supervisor(w: &mut World) -> Result<async_nats::Client, Failure> {
    if let Some(c) = &w.supervisor {
        return Ok(c.clone());
    }
    let principal = supervisor_principal()?;
    let cred: Credential = w.mesh.mint(
        w.mesh.space(),
        &Profile::Supervisor { principal },
        MintOptions::new().expires_in(Duration::from_secs(4 * 3600)),
    )?;
    let client = w.mesh.connect(&cred, "harness-supervisor").await?;
    w.supervisor = Some(client.clone());
    Ok(client)
}

/// One request on `subject` with its reply under the subject's own `.reply.` subtree; the
/// reply as JSON, or what happened instead (no responders, silence, an unreadable body).
pub async fn exchange(
    client: &async_nats::Client,
    subject: &str,
    body: Vec<u8>,
    bound: Duration,
) -> Result<Value, Failure> {
    let reply = format!("{subject}.reply.{}", uuid::Uuid::new_v4().simple());
    let sent = Instant::now();
    let got = receive(client, client, subject, &reply, body, bound).await?;
    answered(got, bound, sent)
}

/// One request `client` sends on `subject` with the reply target `reply`, which `watcher`
/// subscribes to before the request leaves: the first message on it within `bound`, if any.
pub async fn receive(
    client: &async_nats::Client,
    watcher: &async_nats::Client,
    subject: &str,
    reply: &str,
    body: Vec<u8>,
    bound: Duration,
) -> Result<Option<async_nats::Message>, Failure> {
    let mut sub = watcher
        .subscribe(reply.to_string())
        .await
        .map_err(|e| Failure::could_not(format!("subscribe {reply}: {e}")))?;
    watcher
        .flush()
        .await
        .map_err(|e| Failure::could_not(format!("flush: {e}")))?;
    client
        .publish_with_reply(subject.to_string(), reply.to_string(), body.into())
        .await
        .map_err(|e| Failure::could_not(format!("publish {subject}: {e}")))?;
    let got = tokio::time::timeout(bound, sub.next()).await;
    let _ = sub.unsubscribe().await;
    match got {
        Err(_) => Ok(None),
        Ok(None) => Err(Failure::new("an answer", "the subscription ended")),
        Ok(Some(m)) => Ok(Some(m)),
    }
}

/// What [`receive`] got, as a reply: JSON, or the failure naming what happened instead.
pub fn answered(
    got: Option<async_nats::Message>,
    bound: Duration,
    sent: Instant,
) -> Result<Value, Failure> {
    match got {
        None => Err(Failure::new(
            format!("an answer within {} ms", bound.as_millis()),
            "no answer",
        )),
        Some(m) if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) => Err(Failure::new(
            "an answer",
            "no responders (no daemon serves the rail)",
        )),
        Some(m) => parse_reply(&m.payload, sent),
    }
}

/// A reply body as JSON, or the failure naming what arrived.
pub fn parse_reply(payload: &[u8], sent: Instant) -> Result<Value, Failure> {
    serde_json::from_slice(payload).map_err(|e| {
        Failure::new(
            "a JSON reply",
            format!(
                "{} after {} ms: {e}",
                String::from_utf8_lossy(payload),
                sent.elapsed().as_millis()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn includes_matches_objects_by_key_and_arrays_by_element() {
        let have = json!({"fenced": true, "read": 3, "memberships": [{"channel": "g", "generation": 1, "revision": 9}]});
        assert!(contains(&have, &json!({"fenced": true}), "data").is_ok());
        assert!(contains(
            &have,
            &json!({"memberships": [{"channel": "g", "generation": 1}]}),
            "data"
        )
        .is_ok());
        assert_eq!(
            contains(&have, &json!({"memberships": []}), "data"),
            Err("data.memberships (length 1 against 0)".to_string())
        );
        assert_eq!(
            contains(&have, &json!({"fenced": false}), "data"),
            Err("data.fenced".to_string())
        );
        assert_eq!(
            contains(&have, &json!({"missing": 1}), "data"),
            Err("data.missing".to_string())
        );
    }

    #[test]
    fn placeholders_are_braced_names_and_json_braces_are_not() {
        let s = r#"{"a":"{bob.uid}","b":{pad:3}} {i} { x} {}"#;
        let found: Vec<&str> = placeholders(s).into_iter().map(|(_, n)| n).collect();
        assert_eq!(found, vec!["bob.uid", "pad:3", "i"]);
    }

    #[test]
    fn placeholders_name_their_agents() {
        let v: toml::Value = toml::from_str(
            r#"a = { principal = "{alice.principal}", lifecycleUid = "{alice.uid}", x = "{i}", y = "{bob.other}", z = '{"a":{"b":"{carol.uid}"}}' }"#,
        )
        .unwrap();
        let mut named = placeholder_agents(&v);
        named.sort();
        assert_eq!(named, vec!["alice", "alice", "carol"]);
    }
}
