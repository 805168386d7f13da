//! What a libnfs client does with libnfs-utils' tools: `nfs-cat` of whole
//! files (checked against the model), `nfs-ls` of its directory and
//! `nfs-cp` of new files.

use anyhow::{Context, Result, bail};

use super::{Client, OwnedFile, differing};
use crate::data::fill_at;
use crate::libnfs::{nfs_cat, nfs_cp, nfs_ls_names};

impl Client {
    /// `nfs-cat` of `url`, checked against `want`.
    async fn cat_check(&mut self, url: String, want: Vec<u8>, what: &str) -> Result<()> {
        let got = tokio::task::spawn_blocking(move || nfs_cat(&url))
            .await
            .context("nfs-cat task")??;
        self.tally.bytes_read += got.len() as u64;
        let wrong = differing(&want, &got);
        if wrong > 0 {
            self.tally.wrong_bytes += wrong;
            bail!(
                "nfs-cat {what}: {wrong} wrong bytes ({} read, {} expected)",
                got.len(),
                want.len()
            );
        }
        if got.len() < want.len() {
            bail!(
                "nfs-cat {what}: {} bytes, expected {}",
                got.len(),
                want.len()
            );
        }
        Ok(())
    }

    pub(super) async fn cat_own(&mut self, i: usize) -> Result<()> {
        let (name, want) = (self.files[i].name.clone(), self.files[i].data.clone());
        let url = self.plan.url(&self.path(&name));
        self.cat_check(url, want, &name).await
    }

    pub(super) async fn cat_shared(&mut self) -> Result<()> {
        let s = self.pick_shared()?;
        let mut want = vec![0; s.size as usize];
        fill_at(s.seed, 0, &mut want);
        let url = self.plan.url(&s.name);
        self.cat_check(url, want, &s.name).await
    }

    pub(super) async fn list_with_nfs_ls(&mut self) -> Result<()> {
        let url = self.plan.url(&self.dir);
        let listed = tokio::task::spawn_blocking(move || nfs_ls_names(&url))
            .await
            .context("nfs-ls task")??;
        let names = listed.into_iter().map(String::into_bytes).collect();
        self.check_listing(&names, "nfs-ls")
    }

    /// `nfs-cp` of a new local file to a new name.
    pub(super) async fn copy_in(&mut self) -> Result<()> {
        let name = self.new_name();
        let size = self.some_size(self.plan.max_file);
        let mut data = vec![0; size];
        fill_at(self.content_seed(), 0, &mut data);
        let local = self.plan.scratch.join(&name);
        std::fs::write(&local, &data).with_context(|| format!("writing {}", local.display()))?;
        let url = self.plan.url(&self.path(&name));
        let src = local.display().to_string();
        let copied = tokio::task::spawn_blocking(move || nfs_cp(&src, &url))
            .await
            .context("nfs-cp task")?;
        let _ = std::fs::remove_file(&local);
        let fh = match copied {
            Ok(()) => self.nfs.lookup(&self.dir_fh.clone(), &name).await,
            Err(e) => Err(e),
        };
        let fh = match fh {
            Ok(Some(fh)) => fh,
            Ok(None) => bail!("{name} not found after nfs-cp"),
            Err(e) => {
                // Whether the file is there is unknown: keep its name out of
                // the checks (it is neither expected nor removed).
                self.uncertain.insert(name.clone());
                self.tally.tainted_files += 1;
                return Err(e.context(format!("nfs-cp to {name}")));
            }
        };
        self.tally.bytes_written += size as u64;
        // nfs-cp may leave its writes UNSTABLE: the next COMMIT learns the
        // verifier.
        self.files.push(OwnedFile {
            name,
            fh,
            data,
            verf: None,
            unstable: true,
            tainted: false,
        });
        Ok(())
    }
}
