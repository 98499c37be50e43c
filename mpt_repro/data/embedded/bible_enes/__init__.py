"""The embedded parallel corpus (<split>.{en,es,ref}.gz); a package so that wheels ship it."""
