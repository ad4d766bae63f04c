//! Named API tokens: made, listed and revoked by an identity with the
//! `admin` scope; a request's secret is looked up by its digest. Every process keeps the records in memory (a lookup per
//! request must not read the store); a cluster node reloads them whenever
//! any node changes one, as it does toolsets.

use std::collections::HashMap;
use std::sync::Arc;

use tracing::info;

use super::{now, Engine, Error};
use crate::credential::{self, SpecError, StoredToken, TokenSpec};
use crate::identity::{Identity, Scope};
use ferry_proto::audit::AuditKind;

/// The records, by id and by digest.
#[derive(Default)]
pub(crate) struct TokenIndex {
    by_digest: HashMap<String, Arc<StoredToken>>,
    all: Vec<Arc<StoredToken>>,
    /// Whether the records were read at all. Until they are (a cluster
    /// node that has not reached NATS yet), tokens count as required:
    /// not knowing whether any exists must not let everyone in.
    loaded: bool,
}

impl TokenIndex {
    fn new(tokens: Vec<StoredToken>) -> Self {
        let mut all: Vec<Arc<StoredToken>> = tokens.into_iter().map(Arc::new).collect();
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        let by_digest = all
            .iter()
            .filter(|t| t.live())
            .map(|t| (t.digest.clone(), t.clone()))
            .collect();
        Self {
            by_digest,
            all,
            loaded: true,
        }
    }

    fn live(&self) -> impl Iterator<Item = &Arc<StoredToken>> {
        self.all.iter().filter(|t| t.live())
    }
}

/// A token just made: its record, and the secret, shown this once.
#[derive(Debug, Clone)]
pub struct MadeToken {
    pub record: StoredToken,
    pub secret: String,
}

impl From<SpecError> for Error {
    fn from(e: SpecError) -> Self {
        Error::InvalidRequest(e.to_string())
    }
}

impl Engine {
    /// Loads the records from the store: at start, and whenever another
    /// process changed one.
    pub async fn load_tokens(&self) -> Result<(), Error> {
        let _writing = self.token_writes.lock().await;
        self.reload_tokens_holding_lock().await
    }

    /// Whether the records were read from the store yet.
    pub fn tokens_loaded(&self) -> bool {
        self.tokens.read().expect("tokens lock").loaded
    }

    /// Whether any named token is live: then every request must present a
    /// credential, as with `--api-token`.
    pub fn tokens_required(&self) -> bool {
        let index = self.tokens.read().expect("tokens lock");
        !index.loaded || index.live().next().is_some()
    }

    /// The identity of whoever presents `secret`, if it is a live token's.
    /// The lookup is by the secret's digest, so its time says nothing of
    /// how much of a guess was right.
    pub fn identify(&self, secret: &str) -> Option<Identity> {
        if !secret.starts_with(credential::SECRET_PREFIX) {
            return None;
        }
        let digest = credential::digest_of(secret);
        let index = self.tokens.read().expect("tokens lock");
        index.by_digest.get(&digest).map(|t| t.identity())
    }

    /// Every token's record, oldest first, revoked ones included.
    pub fn tokens(&self, by: &Identity) -> Result<Vec<StoredToken>, Error> {
        require(by, Scope::Admin)?;
        let index = self.tokens.read().expect("tokens lock");
        Ok(index.all.iter().map(|t| (**t).clone()).collect())
    }

    /// Makes a token. While no token is live and no `--api-token` is
    /// set, whoever reaches Ferry is anonymous and may make one; the
    /// first must then hold `admin`, or no one could manage tokens once
    /// they are required.
    pub async fn create_token(&self, by: &Identity, spec: TokenSpec) -> Result<MadeToken, Error> {
        require(by, Scope::Admin)?;
        let scopes = spec.check()?;
        let _writing = self.token_writes.lock().await;
        if by.name() == Identity::ANONYMOUS
            && !self.tokens_required()
            && !scopes.contains(&Scope::Admin)
        {
            return Err(Error::Conflict(
                "the first token must have the admin scope: once a token exists every request \
                 needs one, and without an admin token no one could manage them"
                    .into(),
            ));
        }
        let secret = format!(
            "{}{}{}",
            credential::SECRET_PREFIX,
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let record = StoredToken {
            id: format!("tok_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]),
            name: spec.name,
            scopes,
            bounds: spec.bounds,
            digest: credential::digest_of(&secret),
            created_at: now(),
            created_by: by.name().to_owned(),
            revoked_at: None,
            revoked_by: None,
        };
        self.catalog.put_token(&record).await?;
        self.reload_tokens_holding_lock().await?;
        info!(id = %record.id, name = %record.name, by = by.name(), "token created");
        let subject = format!("{} {}", record.id, record.name);
        let scopes = record.scopes.iter().map(|s| s.name()).collect::<Vec<_>>();
        self.audit_change(by, AuditKind::TokenCreated, subject, Some(scopes.join(",")))
            .await?;
        Ok(MadeToken { record, secret })
    }

    /// Revokes token `id`: refused at once by this process, and by every
    /// other as soon as it sees the change. Revoking a revoked token
    /// changes nothing and answers its record.
    pub async fn revoke_token(&self, by: &Identity, id: &str) -> Result<StoredToken, Error> {
        require(by, Scope::Admin)?;
        let _writing = self.token_writes.lock().await;
        let (mut record, admins_left, others_left) = {
            let index = self.tokens.read().expect("tokens lock");
            let found = index
                .all
                .iter()
                .find(|t| t.id == id)
                .ok_or_else(|| Error::NotFound(format!("no token {id:?}")))?;
            let others = index.live().filter(|t| t.id != id);
            let (admins, all): (Vec<_>, Vec<_>) =
                others.partition(|t| t.scopes.contains(&Scope::Admin));
            ((**found).clone(), admins.len(), all.len() + admins.len())
        };
        if !record.live() {
            return Ok(record);
        }
        if record.scopes.contains(&Scope::Admin) && admins_left == 0 && others_left > 0 {
            return Err(Error::Conflict(
                "this is the last live admin token while other tokens are live: no one could \
                 manage them after it; make another admin token first, or revoke the others"
                    .into(),
            ));
        }
        record.revoked_at = Some(now());
        record.revoked_by = Some(by.name().to_owned());
        self.catalog.put_token(&record).await?;
        self.reload_tokens_holding_lock().await?;
        info!(id, by = by.name(), "token revoked");
        let subject = format!("{} {}", record.id, record.name);
        self.audit_change(by, AuditKind::TokenRevoked, subject, None)
            .await?;
        Ok(record)
    }

    async fn reload_tokens_holding_lock(&self) -> Result<(), Error> {
        let stored = self.catalog.tokens().await?;
        *self.tokens.write().expect("tokens lock") = TokenIndex::new(stored);
        Ok(())
    }
}

/// Refuses `by` unless it holds `scope`: 403, changing nothing.
pub fn require(by: &Identity, scope: Scope) -> Result<(), Error> {
    if by.may(scope) {
        Ok(())
    } else {
        Err(Error::Forbidden(format!(
            "{} lacks the {scope} scope this needs",
            by.name()
        )))
    }
}
