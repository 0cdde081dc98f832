//! Manifests that refer to another (OCI 1.1 `subject`), found and recorded as the
//! distribution spec says: the referrers API where the registry has it, else the
//! referrers tag schema, an index at tag `sha256-HEX` of the subject's digest that the
//! client keeps (CNCF distribution 2.8, Debian's docker-registry, has no referrers API).

use crate::artifact::Descriptor;
use crate::image::{Index, OCI_INDEX};
use crate::registry::{Error, Registry, Result};

/// Where a registry keeps `subject`'s referrers without the API: `sha256-HEX`.
pub fn fallback_tag(subject: &str) -> Result<String> {
    if !crate::reference::valid_digest(subject) {
        return Err(Error(format!("{subject:?} is not a sha256 digest")));
    }
    Ok(subject.replacen(':', "-", 1))
}

/// How a referrer was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The registry took the manifest's subject itself (referrers API).
    Api,
    /// The referrers tag schema: the index at `sha256-HEX` lists it.
    Tag,
}

impl Registry {
    /// The referrers of manifest `subject` in `repo` whose artifact type is
    /// `artifact_type`, from the referrers API, else from the tag schema's index (none if
    /// neither has any).
    pub fn referrers(
        &self,
        repo: &str,
        subject: &str,
        artifact_type: &str,
    ) -> Result<Vec<Descriptor>> {
        let of_type = |i: Index| -> Vec<Descriptor> {
            i.manifests
                .into_iter()
                .filter(|d| d.artifact_type.as_deref() == Some(artifact_type))
                .collect()
        };
        if let Some(i) = self.referrers_api(repo, subject)? {
            return Ok(of_type(i));
        }
        Ok(self
            .fallback_index(repo, subject)?
            .map(of_type)
            .unwrap_or_default())
    }

    /// Records `referrer` (already stored, by digest) as a referrer of `subject`: nothing
    /// to do if the registry took its subject (`took_subject`: it answered the manifest's
    /// PUT with `OCI-Subject`), else added to the tag schema's index.
    pub fn record_referrer(
        &self,
        repo: &str,
        subject: &str,
        referrer: Descriptor,
        took_subject: bool,
    ) -> Result<Recorded> {
        if took_subject {
            return Ok(Recorded::Api);
        }
        let mut index = self.fallback_index(repo, subject)?.unwrap_or_default();
        if !index.manifests.iter().any(|d| d.digest == referrer.digest) {
            index.manifests.push(referrer);
        }
        index.media_type = Some(OCI_INDEX.into());
        self.put_manifest(repo, &fallback_tag(subject)?, &index.to_bytes(), OCI_INDEX)?;
        Ok(Recorded::Tag)
    }

    /// `GET /v2/REPO/referrers/DIGEST`: `None` where the registry has no such API (404,
    /// or an answer that is not an index).
    fn referrers_api(&self, repo: &str, subject: &str) -> Result<Option<Index>> {
        if !crate::reference::valid_digest(subject) {
            return Err(Error(format!("{subject:?} is not a sha256 digest")));
        }
        let url = format!("{}/v2/{repo}/referrers/{subject}", self.base_url());
        let mut resp = self.send(
            "GET",
            &url,
            &[("Accept", OCI_INDEX)],
            &crate::registry::Body::Empty,
        )?;
        if !resp.status().is_success() {
            return Ok(None);
        }
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(4 << 20)
            .read_to_vec()
            .map_err(|e| Error(format!("GET {url}: {e}")))?;
        Ok(serde_json::from_slice::<Index>(&bytes).ok())
    }

    /// The tag schema's index for `subject`, if the tag exists.
    fn fallback_index(&self, repo: &str, subject: &str) -> Result<Option<Index>> {
        let tag = fallback_tag(subject)?;
        let Some((bytes, _)) = self.get_manifest_if_any(repo, &tag)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error(format!("{repo}:{tag}: not an image index: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_tag_is_the_digest_with_a_dash() {
        let d = format!("sha256:{}", "c".repeat(64));
        assert_eq!(
            fallback_tag(&d).unwrap(),
            format!("sha256-{}", "c".repeat(64))
        );
        assert!(fallback_tag("sha256:../x").is_err());
    }
}
