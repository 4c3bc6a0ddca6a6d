//! `cotal-delivery`: parses arguments and calls the library. Nothing else lives here.

use clap::Parser;

fn main() {
    let cli = cotal_delivery::cli::Cli::parse();
    std::process::exit(cotal_delivery::cli::run(cli));
}
