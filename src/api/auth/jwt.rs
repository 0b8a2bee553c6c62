//! Signed identities: a JWT in `X-Keel-Identity`, from a trusted proxy that authenticated a
//! person. The algorithm comes from the configured key, never from the token's header: a
//! token naming another algorithm (`none`, or HS256 signed with a public key) is refused.

use std::collections::HashMap;
use std::path::Path;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::api::auth::error::{Rejected, SettingsError};
use crate::api::auth::values::checked_name;
use crate::domain::Role;
use crate::domain::identity::{IdentityForm, RemoteIdentity};
use crate::domain::identity::{checked_id, checked_org_id};

pub(crate) const IDENTITY_HEADER: &str = "x-keel-identity";

/// Furthest in the future a token may expire: a stolen token is worth minutes, not hours.
const MAX_LIFETIME_SECS: u64 = 5 * 60;

/// Shortest HS256 secret accepted: RFC 7518 asks for a key as long as the hash.
const MIN_HS256_SECRET_BYTES: usize = 32;

struct Key {
    key: DecodingKey,
    algorithm: Algorithm,
}

enum Keys {
    /// One key: the token's `kid`, if any, is not consulted.
    One(Key),
    /// A JWKS: the token must name one of these by `kid`.
    ByKid(HashMap<String, Key>),
}

pub(crate) struct JwtVerifier {
    keys: Keys,
    /// This runtime's id, the `aud` every token must name.
    audience: String,
    leeway: u64,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    org: String,
    exp: u64,
    iat: u64,
    project: Option<String>,
    name: Option<String>,
    /// `member` (also when absent), `operator` (of the org) or `runtime_operator` (the
    /// deployment's own, as the signer marks it).
    role: Option<String>,
}

impl JwtVerifier {
    pub(crate) fn hs256(secret: &str, audience: &str, leeway: u64) -> Result<Self, SettingsError> {
        if secret.len() < MIN_HS256_SECRET_BYTES {
            return Err(SettingsError::Invalid(format!(
                "KEEL_REMOTE_JWT_SECRET must be at least {MIN_HS256_SECRET_BYTES} bytes"
            )));
        }
        let key = DecodingKey::from_secret(secret.as_bytes()).map_err(key_error("secret"))?;
        Ok(Self::with(
            Keys::One(Key {
                key,
                algorithm: Algorithm::HS256,
            }),
            audience,
            leeway,
        ))
    }

    /// An Ed25519 (EdDSA) or RSA (RS256) public key in a PEM file.
    pub(crate) fn public_key_file(
        path: &Path,
        audience: &str,
        leeway: u64,
    ) -> Result<Self, SettingsError> {
        let pem = std::fs::read(path).map_err(|e| {
            SettingsError::Invalid(format!(
                "reading KEEL_REMOTE_JWT_PUBLIC_KEY {}: {e}",
                path.display()
            ))
        })?;
        let key = match DecodingKey::from_ed_pem(&pem) {
            Ok(key) => Key {
                key,
                algorithm: Algorithm::EdDSA,
            },
            Err(_) => DecodingKey::from_rsa_pem(&pem)
                .map(|key| Key {
                    key,
                    algorithm: Algorithm::RS256,
                })
                .map_err(|_| {
                    SettingsError::Invalid(format!(
                        "KEEL_REMOTE_JWT_PUBLIC_KEY {} is not an Ed25519 or RSA public key in PEM",
                        path.display()
                    ))
                })?,
        };
        Ok(Self::with(Keys::One(key), audience, leeway))
    }

    /// A JWKS file of Ed25519 and RSA public keys, each with a `kid`.
    pub(crate) fn jwks_file(
        path: &Path,
        audience: &str,
        leeway: u64,
    ) -> Result<Self, SettingsError> {
        let invalid = |why: String| {
            SettingsError::Invalid(format!("KEEL_REMOTE_JWKS_FILE {}: {why}", path.display()))
        };
        let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
        let set: JwkSet = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        let mut keys = HashMap::new();
        for jwk in &set.keys {
            let kid = jwk
                .common
                .key_id
                .clone()
                .ok_or_else(|| invalid("every key needs a kid".into()))?;
            let algorithm = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => Algorithm::RS256,
                AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
                    Algorithm::EdDSA
                }
                _ => return Err(invalid(format!("key {kid} is neither RSA nor Ed25519"))),
            };
            let declared = jwk.common.key_algorithm;
            if declared.is_some_and(|a| a != key_algorithm(algorithm)) {
                return Err(invalid(format!(
                    "key {kid} declares an algorithm other than {algorithm:?}"
                )));
            }
            let key = DecodingKey::from_jwk(jwk).map_err(|e| invalid(format!("key {kid}: {e}")))?;
            if keys.insert(kid.clone(), Key { key, algorithm }).is_some() {
                return Err(invalid(format!("kid {kid} appears twice")));
            }
        }
        if keys.is_empty() {
            return Err(invalid("it holds no keys".into()));
        }
        Ok(Self::with(Keys::ByKid(keys), audience, leeway))
    }

    fn with(keys: Keys, audience: &str, leeway: u64) -> Self {
        JwtVerifier {
            keys,
            audience: audience.to_string(),
            leeway,
        }
    }

    /// The identity a valid token vouches for, and its role.
    pub(crate) fn verify(&self, token: &str) -> Result<(RemoteIdentity, Role), Rejected> {
        // `alg: none` and unknown algorithms fail here: the header does not parse.
        let header = jsonwebtoken::decode_header(token).map_err(|_| "malformed JWT")?;
        let key = match &self.keys {
            Keys::One(key) => key,
            Keys::ByKid(keys) => header
                .kid
                .as_deref()
                .and_then(|kid| keys.get(kid))
                .ok_or("unknown kid")?,
        };
        let mut validation = Validation::new(key.algorithm);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "aud", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = self.leeway;
        let claims = jsonwebtoken::decode::<Claims>(token, &key.key, &validation)
            .map_err(|_| "JWT not valid (signature, algorithm, audience, expiry or claims)")?
            .claims;
        let now = jsonwebtoken::get_current_timestamp();
        if claims.exp > now + MAX_LIFETIME_SECS + self.leeway {
            return Err("JWT expires more than 5 minutes ahead");
        }
        if claims.iat > now + self.leeway {
            return Err("JWT issued in the future");
        }
        let role = Role::parse(claims.role.as_deref())
            .ok_or("JWT role is not member, operator or runtime_operator")?;
        let identity = RemoteIdentity {
            actor_id: checked_id(&claims.sub).ok_or("JWT sub is not a valid id")?,
            org_id: checked_org_id(&claims.org)
                .ok_or("JWT org is not a valid id or is reserved")?,
            runtime_id: self.audience.clone(),
            project_id: match claims.project.as_deref().filter(|p| !p.is_empty()) {
                Some(project) => Some(checked_id(project).ok_or("JWT project is not a valid id")?),
                None => None,
            },
            name: match claims.name.as_deref() {
                Some(name) => Some(checked_name(name).ok_or("JWT name is not printable")?),
                None => None,
            },
            form: IdentityForm::Jwt,
        };
        Ok((identity, role))
    }
}

fn key_algorithm(algorithm: Algorithm) -> KeyAlgorithm {
    match algorithm {
        Algorithm::EdDSA => KeyAlgorithm::EdDSA,
        _ => KeyAlgorithm::RS256,
    }
}

fn key_error(what: &'static str) -> impl Fn(jsonwebtoken::errors::Error) -> SettingsError {
    move |e| SettingsError::Invalid(format!("the JWT {what} is not usable: {e}"))
}
