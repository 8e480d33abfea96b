#!/usr/bin/env node
import { main } from '../src/cli.js';

main(process.argv.slice(2)).then(
  (code) => {
    if (code !== null) process.exit(code);
  },
  (e) => {
    console.error(`relay-node: ${e.message}`);
    process.exit(1);
  },
);
