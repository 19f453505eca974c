//! The TLS of etcd's `https://` endpoints.

/// The TLS of `https://` endpoints: whom to trust, and who we are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificates of the authorities that sign etcd's server
    /// certificates (`[state] ca_file`); none: Mozilla's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// The client's PEM certificate chain (`[state] cert_file`), with
    /// `key_file`, for etcd's `--client-cert-auth`.
    pub cert_file: Option<std::path::PathBuf>,
    /// The client's PEM private key (`[state] key_file`).
    pub key_file: Option<std::path::PathBuf>,
}

impl TlsFiles {
    /// Whether any file is given.
    pub fn any(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// The TLS configuration these files make; an error names the file
    /// and the key (never what a key file holds).
    pub(super) fn config(&self) -> Result<ureq::tls::TlsConfig, String> {
        use ureq::tls::{ClientCert, PemItem, RootCerts, TlsConfig};
        let read = |path: &std::path::Path, key: &str| {
            std::fs::read(path).map_err(|e| format!("{key} {}: {e}", path.display()))
        };
        let mut tls = TlsConfig::builder();
        if let Some(path) = &self.ca_file {
            let pem = read(path, "ca_file")?;
            let mut roots = Vec::new();
            for item in ureq::tls::parse_pem(&pem) {
                if let Ok(PemItem::Certificate(cert)) = item {
                    roots.push(cert);
                }
            }
            if roots.is_empty() {
                return Err(format!(
                    "ca_file {}: no PEM certificate in it",
                    path.display()
                ));
            }
            tls = tls.root_certs(RootCerts::new_with_certs(&roots));
        }
        match (&self.cert_file, &self.key_file) {
            (Some(cert_path), Some(key_path)) => {
                let pem = read(cert_path, "cert_file")?;
                let chain: Vec<_> = ureq::tls::parse_pem(&pem)
                    .filter_map(|item| match item {
                        Ok(PemItem::Certificate(cert)) => Some(cert),
                        _ => None,
                    })
                    .collect();
                if chain.is_empty() {
                    return Err(format!(
                        "cert_file {}: no PEM certificate in it",
                        cert_path.display()
                    ));
                }
                let pem = read(key_path, "key_file")?;
                let key = ureq::tls::parse_pem(&pem)
                    .find_map(|item| match item {
                        Ok(PemItem::PrivateKey(key)) => Some(key),
                        _ => None,
                    })
                    .ok_or_else(|| {
                        format!("key_file {}: no PEM private key in it", key_path.display())
                    })?;
                tls = tls.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
            }
            (None, None) => {}
            (Some(_), None) => return Err("cert_file needs key_file too".into()),
            (None, Some(_)) => return Err("key_file needs cert_file too".into()),
        }
        Ok(tls.build())
    }
}
