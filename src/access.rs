//! Who may do what: the roles of console users and the operator API's rule for each route.
//!
//! A request is made by a [`Principal`]: a user (through a browser session or a personal API
//! token) or the operator token, which acts as an `admin`. [`api_need`] says what a route asks
//! of its caller; a route that changes jobs asks for [`Need::GroupWrite`], and its handler then
//! checks the job's group with [`Principal::may_change_group`], since only the handler knows it.
//!
//! Pure: no IO, no clock. Looking principals up, hashing secrets and answering refusals belong
//! to `admin`.

#![warn(missing_docs)]

use std::fmt;
use std::str::FromStr;

/// A user's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything, users included.
    Admin,
    /// Creates and changes jobs, uploads versions, triggers and kills, in its groups only;
    /// reads everything a viewer reads.
    Operator,
    /// Reads jobs, runs, logs and executors; changes nothing.
    Viewer,
}

impl Role {
    /// Every role, in order of power.
    pub const ALL: &'static [Role] = &[Role::Admin, Role::Operator, Role::Viewer];

    /// The role's name on the wire and in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Operator => "operator",
            Role::Viewer => "viewer",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is not one of [`Role::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role `{0}`: use admin, operator or viewer")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;

    fn from_str(text: &str) -> Result<Role, UnknownRole> {
        Role::ALL
            .iter()
            .copied()
            .find(|role| role.as_str() == text)
            .ok_or_else(|| UnknownRole(text.to_owned()))
    }
}

/// Who makes a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The user, or `None` for the operator token.
    pub user_id: Option<i64>,
    /// The user's name, or `operator-token`: what the audit log shows.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// For an operator, the groups whose jobs it may change.
    pub group_ids: Vec<i64>,
}

/// The name the operator token acts under.
pub const OPERATOR_TOKEN_NAME: &str = "operator-token";

impl Principal {
    /// The shared operator token: an `admin` without a user.
    pub fn operator_token() -> Principal {
        Principal {
            user_id: None,
            name: OPERATOR_TOKEN_NAME.to_owned(),
            role: Role::Admin,
            group_ids: Vec::new(),
        }
    }

    /// Whether it may create, change, run or delete jobs of group `group_id`.
    pub fn may_change_group(&self, group_id: i64) -> bool {
        match self.role {
            Role::Admin => true,
            Role::Operator => self.group_ids.contains(&group_id),
            Role::Viewer => false,
        }
    }

    /// Whether it may do what a route of `need` asks.
    pub fn meets(&self, need: Need) -> bool {
        match need {
            Need::Read | Need::Own => true,
            Need::GroupWrite => matches!(self.role, Role::Admin | Role::Operator),
            Need::Admin => self.role == Role::Admin,
        }
    }
}

/// What a route asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Any signed-in principal: reading jobs, runs, logs, executors, groups.
    Read,
    /// Any signed-in principal, acting on its own things (its personal API tokens).
    Own,
    /// An admin, or an operator of the group concerned (checked again by the handler).
    GroupWrite,
    /// An admin: groups, users, the audit log, and any change not listed.
    Admin,
}

/// What `method` on the operator API's `route` (as routed, without `/api/v1`: `/jobs/{id}`;
/// also `/metrics`, which the same callers read) asks of its caller. A change not listed here is for admins only, so a new route is closed
/// until someone opens it on purpose.
pub fn api_need(method: &str, route: &str) -> Need {
    let reads = matches!(method, "GET" | "HEAD" | "OPTIONS");
    match route {
        // Webhook URLs and delivery errors may say more than a viewer should see.
        "/users" | "/users/{id}" | "/audit" | "/alarms" | "/alarms/{id}" | "/alarms/deliveries" => {
            Need::Admin
        }
        "/tokens" | "/tokens/{id}" => Need::Own,
        // The API's own description: for any caller, like the reads it describes.
        "/openapi.json" => Need::Read,
        // A version's source text and the diff of two are read like the version list.
        "/jobs/{id}/versions/{version}/source" | "/jobs/{id}/versions/{from}/diff/{to}"
            if reads =>
        {
            Need::Read
        }
        _ if reads => Need::Read,
        "/jobs"
        | "/jobs/{id}"
        | "/jobs/{id}/start"
        | "/jobs/{id}/stop"
        | "/jobs/{id}/trigger"
        | "/jobs/{id}/backfill"
        | "/backfills/{id}/pause"
        | "/backfills/{id}/resume"
        | "/backfills/{id}/cancel"
        | "/jobs/{id}/versions"
        | "/jobs/{id}/versions/{version}/activate"
        | "/logs/{id}/kill"
        | "/workflows"
        | "/workflows/{id}"
        | "/workflows/{id}/trigger"
        | "/workflows/{id}/start"
        | "/workflows/{id}/stop"
        | "/workflow-runs/{id}/kill"
        | "/workflow-runs/{id}/nodes/{name}/retry" => Need::GroupWrite,
        _ => Need::Admin,
    }
}

/// Compares two secrets (tokens, CSRF values) in time that depends only on their lengths.
pub fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    if given.len() != expected.len() {
        return false;
    }
    given.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn check(routes: &[(&str, &str)], expect: expect_test::Expect) {
        let principals = [
            Principal::operator_token(),
            Principal {
                user_id: Some(2),
                name: "op".into(),
                role: Role::Operator,
                group_ids: vec![1],
            },
            Principal {
                user_id: Some(3),
                name: "view".into(),
                role: Role::Viewer,
                group_ids: vec![1],
            },
        ];
        let mut out = String::new();
        for (method, route) in routes {
            let need = api_need(method, route);
            let allowed: Vec<&str> = principals
                .iter()
                .map(|p| if p.meets(need) { p.role.as_str() } else { "-" })
                .collect();
            out.push_str(&format!("{method} {route}: {need:?} {}\n", allowed.join(" ")));
        }
        expect.assert_eq(&out);
    }

    #[test]
    fn routes_ask_what_their_changes_need() {
        check(
            &[
                ("GET", "/jobs"),
                ("POST", "/jobs"),
                ("PUT", "/jobs/{id}"),
                ("DELETE", "/jobs/{id}"),
                ("POST", "/jobs/{id}/trigger"),
                ("POST", "/jobs/{id}/backfill"),
                ("GET", "/jobs/{id}/backfills"),
                ("POST", "/backfills/{id}/cancel"),
                ("POST", "/jobs/{id}/versions/{version}/activate"),
                ("GET", "/jobs/{id}/versions/{version}/source"),
                ("GET", "/jobs/{id}/versions/{version}/component"),
                ("GET", "/jobs/{id}/versions/{from}/diff/{to}"),
                ("POST", "/logs/{id}/kill"),
                ("GET", "/logs/{id}/stream"),
                ("GET", "/metrics"),
                ("POST", "/groups"),
                ("GET", "/groups"),
                ("GET", "/audit"),
                ("GET", "/alarms"),
                ("POST", "/alarms"),
                ("PUT", "/alarms/{id}"),
                ("GET", "/alarms/deliveries"),
                ("GET", "/report"),
                ("GET", "/dashboard"),
                ("GET", "/openapi.json"),
                ("GET", "/users"),
                ("POST", "/users"),
                ("POST", "/tokens"),
                ("DELETE", "/tokens/{id}"),
                ("POST", "/something/new"),
            ],
            expect![[r#"
                GET /jobs: Read admin operator viewer
                POST /jobs: GroupWrite admin operator -
                PUT /jobs/{id}: GroupWrite admin operator -
                DELETE /jobs/{id}: GroupWrite admin operator -
                POST /jobs/{id}/trigger: GroupWrite admin operator -
                POST /jobs/{id}/backfill: GroupWrite admin operator -
                GET /jobs/{id}/backfills: Read admin operator viewer
                POST /backfills/{id}/cancel: GroupWrite admin operator -
                POST /jobs/{id}/versions/{version}/activate: GroupWrite admin operator -
                GET /jobs/{id}/versions/{version}/source: Read admin operator viewer
                GET /jobs/{id}/versions/{version}/component: Read admin operator viewer
                GET /jobs/{id}/versions/{from}/diff/{to}: Read admin operator viewer
                POST /logs/{id}/kill: GroupWrite admin operator -
                GET /logs/{id}/stream: Read admin operator viewer
                GET /metrics: Read admin operator viewer
                POST /groups: Admin admin - -
                GET /groups: Read admin operator viewer
                GET /audit: Admin admin - -
                GET /alarms: Admin admin - -
                POST /alarms: Admin admin - -
                PUT /alarms/{id}: Admin admin - -
                GET /alarms/deliveries: Admin admin - -
                GET /report: Read admin operator viewer
                GET /dashboard: Read admin operator viewer
                GET /openapi.json: Read admin operator viewer
                GET /users: Admin admin - -
                POST /users: Admin admin - -
                POST /tokens: Own admin operator viewer
                DELETE /tokens/{id}: Own admin operator viewer
                POST /something/new: Admin admin - -
            "#]],
        );
    }

    #[test]
    fn operators_change_their_groups_only() {
        let operator = Principal {
            user_id: Some(2),
            name: "op".into(),
            role: Role::Operator,
            group_ids: vec![1, 4],
        };
        let viewer = Principal { role: Role::Viewer, ..operator.clone() };
        let changes =
            |p: &Principal| (1..=4).filter(|g| p.may_change_group(*g)).collect::<Vec<_>>();
        assert_eq!(changes(&operator), [1, 4]);
        assert_eq!(changes(&viewer), Vec::<i64>::new());
        assert_eq!(changes(&Principal::operator_token()), [1, 2, 3, 4]);
        assert_eq!("operator".parse::<Role>(), Ok(Role::Operator));
        assert!("root".parse::<Role>().is_err());
    }

    #[test]
    fn secrets_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
