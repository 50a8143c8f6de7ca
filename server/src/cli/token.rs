//! `tether token`: mints a bearer token from the server's auth secret.

use std::process::ExitCode;

/// `tether token`: mints a token from the auth secret and prints only it.
pub fn token(args: &crate::config::TokenArgs) -> ExitCode {
    let fail = |message: String| {
        eprintln!("tether: error: {message}");
        ExitCode::from(2)
    };
    let secret =
        match crate::config::read_secret(args.auth_secret.as_ref(), args.auth_secret_file.as_ref())
        {
            Ok(Some(secret)) => secret,
            Ok(None) => {
                return fail(
                "no secret: set TETHER_AUTH_SECRET or pass --auth-secret-file, as for tether serve"
                    .to_owned(),
            );
            }
            Err(err) => return fail(err.to_string()),
        };
    let minted = crate::auth::token::Authenticator::new(&secret)
        .and_then(|auth| auth.mint(&args.sub, args.role, &args.projects, args.ttl));
    match minted {
        Ok(token) => {
            println!("{token}");
            ExitCode::SUCCESS
        }
        Err(err) => fail(err.to_string()),
    }
}
